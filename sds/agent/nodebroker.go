package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/sds/attest"
	"github.com/trustbridge/trustbridge/sds/broker"
)

// DefaultBrokerSocketPath is where a node agent serves the SPIFFE Broker
// API (and SPIRE's Delegated Identity API) when brokers are enabled
// without a path; the chart and docs/brokers.md use it too. It is a
// directory of its own, apart from the one every pod may mount for SDS.
const DefaultBrokerSocketPath = "/run/trustbridge/broker/broker.sock"

// BrokerConfig makes a node agent serve brokers (ztunnel, Cilium): the
// SPIFFE Broker API and SPIRE's Delegated Identity API on a socket of
// their own, for the workloads of this node only.
type BrokerConfig struct {
	// Socket is the unix socket; DefaultBrokerSocketPath when empty.
	Socket string
	// SocketGroup, when set, may also connect (0660); else 0600.
	SocketGroup string
	// Policy says who may broker (required).
	Policy *broker.Policy
	// Pods resolves Pod references; nil refuses them (no API server).
	Pods PodReferences
}

// PodReferences finds this node's pods by reference (attest.Pods).
type PodReferences interface {
	LookupPod(ctx context.Context, ref attest.PodRef) (attest.KubernetesFacts, error)
	// PodsOf is this node's running pods of a service account.
	PodsOf(namespace, serviceAccount string) ([]attest.KubernetesFacts, error)
	// ChangedPod and ChangedAccount are closed on the next change of a
	// pod, or of a service account's pods.
	ChangedPod(uid string) <-chan struct{}
	ChangedAccount(namespace, serviceAccount string) <-chan struct{}
}

// nodeBrokers is the node as the broker server sees it: the caller of
// the broker socket attested as any caller is, and each referenced
// workload attested by the agent itself (a pid's cgroups, a pod from the
// API server) and served the Cell its identity has on the Workload API.
type nodeBrokers struct {
	wl       *nodeWorkloads
	attested *AttestedAuthenticator
	pods     PodReferences
	// self is the node agent's own identity, never brokered.
	self spiffeid.ID
}

var _ broker.Node = (*nodeBrokers)(nil)

// IdentifyCaller attests the broker socket's caller: its uid, its pod's
// service account, and its SPIFFE ID: its certificate's over mutual TLS,
// else the identity the map gives it, if any.
func (b *nodeBrokers) IdentifyCaller(ctx context.Context) (broker.Caller, error) {
	facts, err := b.attested.Attestor.AttestPeer(ctx)
	if err != nil {
		return broker.Caller{}, attestError(ctx, err)
	}
	c := broker.Caller{PID: facts.PID, UID: facts.Unix.UID}
	if k := facts.Kubernetes; k != nil && k.Namespace != "" {
		c.ServiceAccount = k.Namespace + "/" + k.ServiceAccount
	}
	if m := b.attested.Map.Load(); m != nil {
		if ident, err := m.Identify(b.attested.workload(facts)); err == nil {
			c.ID = ident.ID
		}
	}
	if p, ok := attest.CallerFrom(ctx); ok && !p.SVID.IsZero() {
		// A certificate does not replace attestation: it is the identity
		// the caller's process attests as, or it is refused (a key copied
		// out of the broker's pod proves nothing in another process).
		if p.SVID != c.ID {
			attested := "no identity"
			if !c.ID.IsZero() {
				attested = c.ID.String()
			}
			return broker.Caller{}, fmt.Errorf("pid %d presents a certificate for %s but attests as %s (uid %d, service account %q): the certificate must be the identity the identity map gives the process",
				c.PID, p.SVID, attested, c.UID, c.ServiceAccount)
		}
		c.Certified = true
	}
	return c, nil
}

// attestError maps an attestation failure for the broker server.
func attestError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	switch {
	case errors.Is(err, attest.ErrKubeUnavailable):
		return fmt.Errorf("%w: %w", authn.ErrUnavailable, err)
	case errors.Is(err, attest.ErrInvalidPID), errors.Is(err, attest.ErrInvalidPodRef):
		return fmt.Errorf("%w: %w", broker.ErrInvalidReference, err)
	case errors.Is(err, attest.ErrProcessGone), errors.Is(err, attest.ErrProcessReplaced),
		errors.Is(err, attest.ErrUnknownPod), errors.Is(err, attest.ErrUnknownContainer), errors.Is(err, attest.ErrPodNotRunning):
		return fmt.Errorf("%w: %w", broker.ErrNotFound, err)
	}
	return fmt.Errorf("%w: %w", broker.ErrNotEntitled, err)
}

// Resolve attests the workload ref names and holds its identity.
func (b *nodeBrokers) Resolve(ctx context.Context, ref broker.Reference) (*broker.Workload, error) {
	switch {
	case ref.Pod != nil:
		return b.resolvePod(ctx, ref)
	case ref.Account != nil:
		return b.resolveAccount(ctx, ref)
	}
	c, err := b.attested.Attestor.PinPID(ref.PID)
	if err != nil {
		return nil, attestError(ctx, err)
	}
	p := &pinned{c: c, refs: 1}
	w, err := b.resolvePinned(ctx, p)
	p.release() // this call's hold: w has its own, if there is a w
	return w, err
}

// pinned is a process a broker named, pinned, shared by the successive
// Workloads of one stream (each holds it): it is closed when the last
// lets go.
type pinned struct {
	c    *attest.Caller
	mu   sync.Mutex
	refs int
}

func (p *pinned) hold() {
	p.mu.Lock()
	p.refs++
	p.mu.Unlock()
}

// release lets go of one hold, closing the pin with the last.
func (p *pinned) release() {
	p.mu.Lock()
	p.refs--
	last := p.refs == 0
	p.mu.Unlock()
	if last {
		_ = p.c.Close()
	}
}

// resolvePinned attests the pinned process (again: it must still be the
// process that was pinned) and holds its identity. Its Again does the
// same, so a stream never moves to another process that reused the pid.
func (b *nodeBrokers) resolvePinned(ctx context.Context, p *pinned) (*broker.Workload, error) {
	facts, err := b.attested.Attestor.Attest(ctx, p.c)
	if err != nil {
		return nil, attestError(ctx, err)
	}
	if facts.Kubernetes == nil {
		return nil, fmt.Errorf("%w: pid %d is not in a pod: brokers get the identities of this node's pods only", broker.ErrNotEntitled, p.c.PID)
	}
	w, err := b.hold(ctx, b.attested.workload(facts), p.c.Exited())
	if err != nil {
		return nil, err
	}
	k := facts.Kubernetes
	w.Name = fmt.Sprintf("pid %d in pod %s/%s (container %s)", p.c.PID, k.Namespace, k.PodName, k.ContainerName)
	p.hold()
	release := w.Release
	w.Release = func() { release(); p.release() }
	w.Again = func(ctx context.Context) (*broker.Workload, error) { return b.resolvePinned(ctx, p) }
	return w, nil
}

// resolvePod resolves a Pod reference: the pod must be on this node and
// hold every fact the reference asserts.
func (b *nodeBrokers) resolvePod(ctx context.Context, ref broker.Reference) (*broker.Workload, error) {
	if b.pods == nil {
		return nil, fmt.Errorf("%w: this agent reads no pods from an API server (no --kubeconfig, not in a pod): reference workloads by pid", broker.ErrNotFound)
	}
	k, changed, err := b.lookupPod(ctx, attest.PodRef{Namespace: ref.Pod.Namespace, Name: ref.Pod.Name, UID: ref.Pod.UID})
	if err != nil {
		return nil, err
	}
	w := b.attested.workload(attest.Facts{Kubernetes: &k})
	// Nothing about a process was attested: no unix facts, no container.
	w.Unix = false
	if err := checkAll(ref.Checks, w); err != nil {
		return nil, err
	}
	held, err := b.hold(ctx, w, changed)
	if err != nil {
		return nil, err
	}
	held.Name = fmt.Sprintf("pod %s/%s (uid %s)", k.Namespace, k.PodName, k.PodUID)
	// Again, the pod is this one (its UID): a pod re-created under the
	// name is another workload, and ends the stream.
	pinnedRef := ref
	pinnedRef.Pod = &broker.PodReference{Namespace: k.Namespace, Name: k.PodName, UID: k.PodUID}
	held.Again = func(ctx context.Context) (*broker.Workload, error) { return b.resolvePod(ctx, pinnedRef) }
	return held, nil
}

// lookupPod finds ref's pod, and the channel of its changes from before
// the pod was read, so that a change in between is not missed. With the
// UID known (every recheck's pinned reference) that is one lookup; by
// name only, the pod is read again once its UID is known.
func (b *nodeBrokers) lookupPod(ctx context.Context, ref attest.PodRef) (attest.KubernetesFacts, <-chan struct{}, error) {
	var changed <-chan struct{}
	if ref.UID != "" {
		changed = b.pods.ChangedPod(ref.UID)
	}
	k, err := b.pods.LookupPod(ctx, ref)
	if err == nil && changed == nil {
		changed = b.pods.ChangedPod(k.PodUID)
		k, err = b.pods.LookupPod(ctx, attest.PodRef{UID: k.PodUID})
	}
	if err != nil {
		return attest.KubernetesFacts{}, nil, attestError(ctx, err)
	}
	return k, changed, nil
}

// resolveAccount resolves a service account: its running pods on this
// node that hold every asserted fact, which must all have one identity
// (the broker means them as one workload, as ztunnel's selector mode
// does with k8s:ns and k8s:sa).
func (b *nodeBrokers) resolveAccount(ctx context.Context, ref broker.Reference) (*broker.Workload, error) {
	if b.pods == nil {
		return nil, fmt.Errorf("%w: this agent reads no pods from an API server (no --kubeconfig, not in a pod): reference workloads by pid", broker.ErrNotFound)
	}
	a := ref.Account
	changed := b.pods.ChangedAccount(a.Namespace, a.Name)
	pods, err := b.pods.PodsOf(a.Namespace, a.Name)
	if err != nil {
		return nil, attestError(ctx, err)
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("%w: no running pod of service account %s/%s is on node %s", broker.ErrNotFound, a.Namespace, a.Name, b.attested.NodeName)
	}
	m := b.attested.Map.Load()
	if m == nil {
		return nil, fmt.Errorf("%w: no identity map loaded yet", authn.ErrUnavailable)
	}
	var (
		first  *identitymap.Identity
		chosen identitymap.Workload
		failed error
	)
	for _, k := range pods {
		w := b.attested.workload(attest.Facts{Kubernetes: &k})
		w.Unix = false
		if err := checkAll(ref.Checks, w); err != nil {
			failed = err
			continue
		}
		ident, err := m.Identify(w)
		if err != nil {
			return nil, fmt.Errorf("%w: pod %s/%s of service account %s/%s: %w", broker.ErrNotEntitled, k.Namespace, k.PodName, a.Namespace, a.Name, err)
		}
		if first == nil {
			first, chosen = &ident, w
			continue
		}
		if identityRequest(*first).key() != identityRequest(ident).key() {
			return nil, fmt.Errorf("%w: the pods of service account %s/%s on this node have different identities (%s, %s): name the pod (k8s:pod-uid, or k8s:pod-name)",
				broker.ErrNotEntitled, a.Namespace, a.Name, describe(first.ID, first.DNSNames), describe(ident.ID, ident.DNSNames))
		}
	}
	if first == nil {
		return nil, failed
	}
	held, err := b.hold(ctx, chosen, changed)
	if err != nil {
		return nil, err
	}
	held.Name = fmt.Sprintf("service account %s/%s (%d running pods on this node)", a.Namespace, a.Name, len(pods))
	return held, nil
}

func checkAll(checks []broker.Check, w identitymap.Workload) error {
	for _, c := range checks {
		if err := check(c, w); err != nil {
			return err
		}
	}
	return nil
}

// check refuses a pod that does not have a fact a selector asserted.
func check(c broker.Check, w identitymap.Workload) error {
	var have string
	switch c.Kind {
	case "namespace":
		have = w.Namespace
	case "service_account":
		have = w.ServiceAccount
	case "node_name":
		have = w.NodeName
	case "pod_label":
		v, ok := w.PodLabels[c.Key]
		if !ok {
			return fmt.Errorf("%w: selector %q: the pod has no label %q", broker.ErrNotEntitled, c.Selector, c.Key)
		}
		have = v
	default:
		return fmt.Errorf("%w: selector %q is not checked here", broker.ErrInvalidReference, c.Selector)
	}
	if have != c.Value {
		return fmt.Errorf("%w: selector %q does not hold for pod %s/%s: it has %q", broker.ErrNotEntitled, c.Selector, w.Namespace, w.PodName, have)
	}
	return nil
}

// hold maps w's facts to its identity and holds it, with its Cell.
func (b *nodeBrokers) hold(ctx context.Context, w identitymap.Workload, gone <-chan struct{}) (*broker.Workload, error) {
	m := b.attested.Map.Load()
	if m == nil {
		return nil, fmt.Errorf("%w: no identity map loaded yet", authn.ErrUnavailable)
	}
	ident, err := m.Identify(w)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", broker.ErrNotEntitled, err)
	}
	if ident.ID == b.self {
		return nil, fmt.Errorf("%w: %s is the node agent's own identity, which is never brokered", broker.ErrNotEntitled, ident.ID)
	}
	h, err := b.wl.auth.acquire(ctx, identityRequest(ident))
	if err != nil {
		return nil, brokerRefusal(ctx, err)
	}
	c := b.wl.ref(h)
	var once sync.Once
	return &broker.Workload{ID: ident.ID, Source: c.cell, Gone: gone, Release: func() {
		once.Do(func() {
			b.wl.unref(c)
			h.Release()
		})
	}}, nil
}

// brokerRefusal maps a failure to get a workload's certificate: the
// server refusing it refuses the workload, anything else is Unavailable.
func brokerRefusal(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if status.Code(err) == codes.PermissionDenied || (errors.Is(err, authn.ErrNotAttested) && !errors.Is(err, authn.ErrUnavailable)) {
		return fmt.Errorf("%w: %w", broker.ErrNotEntitled, err)
	}
	return fmt.Errorf("%w: %w", authn.ErrUnavailable, err)
}

// ResolveCaller holds the broker's own identity: the trust SPIRE's
// Delegated Identity API's bundle streams carry.
func (b *nodeBrokers) ResolveCaller(ctx context.Context) (*broker.Workload, error) {
	facts, err := b.attested.Attestor.AttestPeer(ctx)
	if err != nil {
		return nil, attestError(ctx, err)
	}
	w, err := b.hold(ctx, b.attested.workload(facts), nil)
	if err != nil {
		return nil, fmt.Errorf("the SPIRE Delegated Identity API's bundle streams carry the trust of the broker's own identity, and the broker has none (give it one in the identity map, or use the SPIFFE Broker API's bundle streams, which name a workload): %w", err)
	}
	w.Name = "the broker itself"
	return w, nil
}

// serveBrokers serves the broker socket until ctx is done.
func (a *Agent) serveBrokers(auth *nodeAuthenticator, wl *nodeWorkloads, jwt *jwtMinter) (func(context.Context) error, error) {
	bc := a.node.Broker
	srv, err := broker.New(broker.Config{
		Node:   &nodeBrokers{wl: wl, attested: auth.attested.(*AttestedAuthenticator), pods: bc.Pods, self: a.rot.ID()},
		Policy: bc.Policy, JWT: jwt, RecheckInterval: nodeReattestInterval,
		Clock: a.clock, Logger: a.log, Registerer: a.reg,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	gid := -1
	if bc.SocketGroup != "" {
		if gid, err = lookupGroup(bc.SocketGroup); err != nil {
			return nil, fmt.Errorf("agent: broker socket group: %w", err)
		}
	}
	path := bc.Socket
	if path == "" {
		path = DefaultBrokerSocketPath
	}
	// A broker holds a stream per workload (and per API) on one
	// connection: the local sockets' per-connection bound (made for one
	// Envoy) would hold its streams back. The server's own bound on
	// broker streams applies across connections.
	gs := newLocalGRPCServer(grpc.Creds(a.node.Attestor.CredentialsWithTLS(a.brokerTLS(auth.trust))),
		grpc.MaxConcurrentStreams(broker.DefaultMaxStreams))
	srv.Register(gs)
	return func(ctx context.Context) error {
		ln, err := listenWorkloadSocket(ctx, path, gid, a.probeTimeout)
		if err != nil {
			return fmt.Errorf("agent: broker socket: %w", err)
		}
		a.log.Info("SPIFFE Broker API and SPIRE Delegated Identity API listening", "socket", path,
			"SPIFFE_BROKER_SOCKET", endpointSocket(path), "brokers", bc.Policy.String())
		done := make(chan error, 1)
		go func() { done <- gs.Serve(ln) }()
		select {
		case <-ctx.Done():
			gs.Stop()
			<-done
			return nil
		case err := <-done:
			return fmt.Errorf("agent: serving brokers: %w", err)
		}
	}, nil
}

// brokerTLS is the broker socket's mutual TLS (the Broker Endpoint
// specification's transport): the node agent's own X509-SVID, and
// brokers of its trust domain, verified against that trust domain's
// roots. Both are read at each handshake, so renewals and root rotations
// need no restart.
func (a *Agent) brokerTLS(trust *nodeTrust) func() (*tls.Config, error) {
	cfg := tlsconfig.MTLSServerConfig(rotatorSVID{a.rot}, localRoots{trust: trust, rot: a.rot},
		tlsconfig.AuthorizeMemberOf(trust.local))
	return func() (*tls.Config, error) { return cfg, nil }
}

// rotatorSVID is the Rotator's current credential as an x509svid.Source.
type rotatorSVID struct{ rot rotator }

func (s rotatorSVID) GetX509SVID() (*x509svid.SVID, error) {
	cell, id := s.rot.Cell(), s.rot.ID()
	if cell == nil {
		return nil, errors.New("the node agent has no certificate of its own yet")
	}
	cred, err := cell.Credential(context.Background(), id)
	if err != nil {
		return nil, fmt.Errorf("the node agent's own certificate: %w", err)
	}
	return &x509svid.SVID{ID: id, Certificates: cred.Chain, PrivateKey: cred.Key}, nil
}

// localRoots is the local trust domain's roots as an x509bundle.Source:
// the latest the server streamed for the node's workloads, which follow a
// root rotation, else (while no workload is held) those that came with
// the node agent's own certificate.
type localRoots struct {
	trust *nodeTrust
	rot   rotator
}

func (l localRoots) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != l.trust.local {
		return nil, fmt.Errorf("brokers of trust domain %s only, not %s", l.trust.local.Name(), td.Name())
	}
	var roots []*x509.Certificate
	if bs := l.trust.localBundles(); len(bs) > 0 {
		roots = bs[0].X509Authorities()
	} else {
		roots = l.rot.Trust().Local
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("no roots of trust domain %s yet", td.Name())
	}
	return x509bundle.FromX509Authorities(td, roots), nil
}
