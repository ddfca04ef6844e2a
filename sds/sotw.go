package sds

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// StreamSecrets serves one state-of-the-world stream: every response holds
// every subscribed resource that exists.
func (s *Server) StreamSecrets(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	x := &sotw{stream: stream}
	return s.serveStream(stream.Context(), typeSotW, x.run)
}

// sotw is one StreamSecrets stream.
type sotw struct {
	*session
	stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]

	names       []string // subscribed, sorted
	nonce       uint64
	lastNonce   string // of the last response; "" before the first
	lastVersion string
	// What the last push computed from: an ACK or NACK that changes none
	// of it would compute the same response, so it is not recomputed.
	pushedNames []string
	pushedTrust *Trust
	pushedCred  *Credential
	pushedKey   string // decision key
}

func (x *sotw) run(ctx context.Context, s *Server, ident authn.Identity, r authn.Request, entry *certEntry) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reqs, errc := receive(ctx, x.stream.Recv)
	// The first request carries the node, whose metadata decides what ALL
	// looks like for the whole stream.
	first, err := firstRequest(ctx, reqs, errc)
	if first == nil {
		return err
	}
	x.session = s.newSession(typeSotW, ident, r, first.GetNode(), entry)
	defer x.stop()
	x.log().Debug("sds stream opened", "disable_spiffe_validation", x.plain)
	if err := x.onRequest(ctx, first); err != nil {
		return err
	}
	s.handled()
	return loop(ctx, x.session, reqs, errc, func(req *discoveryv3.DiscoveryRequest) error { return x.onRequest(ctx, req) }, x.push)
}

// recvEnd is the stream's result when reading failed: a client that closed
// its side ends the stream cleanly.
func recvEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// onRequest handles an ACK, a NACK or a new subscription. A request whose
// response_nonce is not the last one sent answers a response that has
// since been superseded (the xDS protocol's stale nonce): it is neither ACK
// nor NACK and gets no response of its own, but its resource names are
// still the client's latest subscription, which the next response honours.
func (x *sotw) onRequest(ctx context.Context, req *discoveryv3.DiscoveryRequest) error {
	if ref := checkRequest(req.GetTypeUrl(), req.GetResourceNames()); ref != nil {
		return ref
	}
	names := dedupSorted(req.GetResourceNames())
	if ref := x.checkSubscription(names, true); ref != nil {
		return ref
	}
	x.names = names
	nonce := req.GetResponseNonce()
	if x.lastNonce == "" || nonce == "" {
		// Nothing sent on this stream yet (a reconnecting client may
		// still quote a nonce of its previous stream), or a client that
		// does not quote nonces: a plain request.
		return x.push(ctx)
	}
	if nonce != x.lastNonce {
		x.log().Debug("stale request ignored", "nonce", nonce, "last_nonce", x.lastNonce)
		return nil
	}
	if d := req.GetErrorDetail(); d != nil {
		// The client keeps what it had. Resending the same version would
		// only be rejected again: the next change is pushed.
		x.s.metrics.nacks.WithLabelValues(typeSotW).Inc()
		x.log().Log(ctx, x.s.nackLevel(), "envoy rejected secrets", "nonce", nonce, "version", x.lastVersion,
			"applied_version", req.GetVersionInfo(), "code", codes.Code(d.GetCode()).String(), "detail", d.GetMessage())
	}
	if x.pushedTrust == x.trust && x.pushedCred == x.cred && x.pushedKey == x.decision.Key() && slices.Equal(x.pushedNames, names) {
		// The common case, an ACK of what was just sent: every change
		// since was pushed by the stream's loop, not by this request.
		return nil
	}
	return x.push(ctx)
}

// push sends every subscribed resource that exists, unless the client
// already got exactly that.
func (x *sotw) push(ctx context.Context) error {
	res, err := x.resources(ctx, x.names)
	if err != nil {
		return err
	}
	x.pushedNames, x.pushedTrust, x.pushedCred, x.pushedKey = x.names, x.trust, x.cred, x.decision.Key()
	version := versionOf(res)
	if x.lastNonce == "" && len(res) == 0 || x.lastNonce != "" && version == x.lastVersion {
		return nil
	}
	x.nonce++
	resp := &discoveryv3.DiscoveryResponse{
		VersionInfo: version,
		Resources:   anys(res),
		TypeUrl:     resourcev3.SecretType,
		Nonce:       strconv.FormatUint(x.nonce, 10),
	}
	x.lastNonce, x.lastVersion = resp.Nonce, version
	// Send blocks while the client does not read; nothing else waits on
	// this stream meanwhile, and whatever changes is sent afterwards as
	// the state of that moment, never as a queue of updates.
	if err := x.stream.Send(resp); err != nil {
		return err
	}
	x.s.metrics.responses.WithLabelValues(typeSotW).Inc()
	return nil
}
