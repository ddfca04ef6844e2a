package sds

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// DeltaSecrets serves one incremental stream: a response holds only the
// resources that changed since the client last got them, and the names of
// those that went away.
func (s *Server) DeltaSecrets(stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	x := &delta{stream: stream, subscribed: make(map[string]bool), known: make(map[string]string)}
	return s.serveStream(stream.Context(), typeDelta, x.run)
}

// delta is one DeltaSecrets stream.
type delta struct {
	*session
	stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]

	subscribed map[string]bool
	known      map[string]string // resource name → version the client has
	nonce      uint64
	lastNonce  string
}

func (x *delta) run(ctx context.Context, s *Server, ident authn.Identity, r authn.Request, entry *certEntry) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reqs, errc := receive(ctx, x.stream.Recv)
	first, err := firstRequest(ctx, reqs, errc)
	if first == nil {
		return err
	}
	x.session = s.newSession(typeDelta, ident, r, first.GetNode(), entry)
	defer x.stop()
	x.log().Debug("sds delta stream opened", "disable_spiffe_validation", x.plain)

	if err := x.open(ctx, first); err != nil {
		return err
	}
	s.handled()
	return loop(ctx, x.session, reqs, errc, func(req *discoveryv3.DeltaDiscoveryRequest) error {
		if err := x.onRequest(ctx, req); err != nil {
			return err
		}
		return x.push(ctx)
	}, x.push)
}

// open takes the versions a reconnecting client already holds and its
// first subscription, and sends what it lacks.
func (x *delta) open(ctx context.Context, first *discoveryv3.DeltaDiscoveryRequest) error {
	initial := first.GetInitialResourceVersions()
	if len(initial) > MaxNames {
		return &refusal{codes.InvalidArgument, "too_many_names", fmt.Sprintf("%d initial resource versions; at most %d are allowed", len(initial), MaxNames), nil}
	}
	for n, v := range initial {
		if len(n) > MaxNameLen {
			return &refusal{codes.InvalidArgument, "too_many_names", fmt.Sprintf("an initial resource name is %d bytes long; at most %d are allowed", len(n), MaxNameLen), nil}
		}
		x.known[n] = v
	}
	if err := x.onRequest(ctx, first); err != nil {
		return err
	}
	// Versions of names the client did not subscribe to mean nothing.
	for n := range x.known {
		if !x.subscribed[n] {
			delete(x.known, n)
		}
	}
	return x.push(ctx)
}

// onRequest applies a request's subscription changes, which count even
// when its nonce is stale, and logs a NACK. It sends nothing.
func (x *delta) onRequest(ctx context.Context, req *discoveryv3.DeltaDiscoveryRequest) error {
	sub, unsub := req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe()
	if ref := checkRequest(req.GetTypeUrl(), sub); ref != nil {
		return ref
	}
	if ref := checkRequest("", unsub); ref != nil {
		return ref
	}
	if ref := x.checkSubscription(sub, true); ref != nil {
		return ref
	}
	nonce := req.GetResponseNonce()
	if x.lastNonce != "" && nonce == x.lastNonce {
		if d := req.GetErrorDetail(); d != nil {
			// No resend: the client's rejection stands until the next
			// change, which is pushed as usual.
			x.s.metrics.nacks.WithLabelValues(typeDelta).Inc()
			x.log().Log(ctx, x.s.nackLevel(), "envoy rejected secrets", "nonce", nonce,
				"code", codes.Code(d.GetCode()).String(), "detail", d.GetMessage())
		}
	}
	for _, n := range unsub {
		delete(x.subscribed, n)
		delete(x.known, n)
	}
	for _, n := range sub {
		x.subscribed[n] = true
	}
	if len(x.subscribed) > MaxNames {
		return &refusal{codes.InvalidArgument, "too_many_names", fmt.Sprintf("%d resource names subscribed; at most %d are allowed", len(x.subscribed), MaxNames), nil}
	}
	return nil
}

// push sends the subscribed resources whose version the client does not
// have, and the names of those it has that no longer exist.
func (x *delta) push(ctx context.Context) error {
	names := make([]string, 0, len(x.subscribed))
	for n := range x.subscribed {
		names = append(names, n)
	}
	slices.Sort(names)
	res, err := x.resources(ctx, names)
	if err != nil {
		return err
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: resourcev3.SecretType, SystemVersionInfo: versionOf(res)}
	present := make(map[string]bool, len(res))
	for _, e := range res {
		present[e.name] = true
		if x.known[e.name] == e.version {
			continue
		}
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: e.name, Version: e.version, Resource: e.any})
	}
	for _, n := range names {
		if _, has := x.known[n]; has && !present[n] {
			resp.RemovedResources = append(resp.RemovedResources, n)
		}
	}
	if len(resp.Resources) == 0 && len(resp.RemovedResources) == 0 {
		return nil
	}
	for _, r := range resp.Resources {
		x.known[r.Name] = r.Version
	}
	for _, n := range resp.RemovedResources {
		delete(x.known, n)
	}
	x.nonce++
	resp.Nonce = strconv.FormatUint(x.nonce, 10)
	x.lastNonce = resp.Nonce
	if err := x.stream.Send(resp); err != nil {
		return err
	}
	x.s.metrics.responses.WithLabelValues(typeDelta).Inc()
	return nil
}
