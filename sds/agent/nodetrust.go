package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

// workloadTrust is one message of the server's trust for one workload
// (WatchBundles impersonating it, with peer limits): the bundles it may
// trust, its own trust domain's included, and, of those, the trust
// domains granted only for some peers with those peers (trustpolicy
// pattern syntax).
type workloadTrust struct {
	Bundles    []*spiffebundle.Bundle
	PeerLimits map[spiffeid.TrustDomain][]string
}

// trustWatchFunc streams the server's trust for workload id to fn until
// ctx ends, the stream fails, or fn returns an error. A message that does
// not parse reaches fn as an error and the stream goes on.
type trustWatchFunc func(ctx context.Context, id spiffeid.ID, fn func(workloadTrust, error) error) error

// nodeTrust is the trust of a node agent's workloads. For each identity
// the IdentityCache holds, follow (its Companion) streams what the server
// decided that workload may trust, decided as if the workload had asked:
// that decision, with its peer limits, is what Decide answers for the
// identity, so each workload's validation contexts carry its own trust
// and nothing another workload of the node was granted. The roots of
// every trust domain any held workload may trust make up the local SDS
// server's Trust: each trust domain's roots are the latest the server
// sent for it (it sends every workload the same), and a trust domain no
// held workload may trust any more leaves it.
type nodeTrust struct {
	local spiffeid.TrustDomain
	watch trustWatchFunc
	cell  *sds.TrustCell
	// serverRoots, when set, is told the local trust domain's roots
	// whenever they change, so the node's own client keeps verifying the
	// server across a root rotation.
	serverRoots func([]*x509.Certificate)
	// revoke, when set, is told an identity the server refused to this
	// node on its trust stream (IdentityCache.Revoke).
	revoke  func(spiffeid.ID, error)
	clock   clock.Clock
	log     *slog.Logger
	failLog *ratelimit.LogLimiter
	metrics *metrics
	retry   loop.Backoff
	// localOnly is the decision of an identity whose trust has not
	// arrived: its own trust domain only.
	localOnly *trustpolicy.Policy

	mu  sync.Mutex
	ids map[spiffeid.ID]*identityTrust
	tds map[spiffeid.TrustDomain]*tdRoots
	// arrived is closed, and replaced, whenever an identity's first
	// trust arrives: the wake-up of a stream decided before it did.
	arrived chan struct{}
}

// identityTrust is the server's latest decision for one identity.
type identityTrust struct {
	// policy grants the identity what the server decided; nil before
	// the first trust.
	policy *trustpolicy.Policy
	// tds are the trust domains of the last trust, each counted in
	// nodeTrust.tds.
	tds []spiffeid.TrustDomain
	// changed is closed, and replaced, when policy changes.
	changed chan struct{}
	// bundles are the whole trust domains the identity may trust, its
	// own first, for the Workload API, whose bundles cannot carry peer
	// limits (those trust domains are left out); bundlesChanged is
	// closed, and replaced, when they change.
	bundles        []*spiffebundle.Bundle
	bundlesChanged chan struct{}
	gone           bool
}

// tdRoots is one trust domain's latest roots and how many held
// identities may trust it.
type tdRoots struct {
	roots []*x509.Certificate
	refs  int
}

func newNodeTrust(local spiffeid.TrustDomain, watch trustWatchFunc, serverRoots func([]*x509.Certificate), clk clock.Clock, log *slog.Logger, m *metrics) (*nodeTrust, error) {
	localOnly, err := trustpolicy.Compile(local, trustpolicy.DefaultDeny, nil)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	return &nodeTrust{
		local: local, watch: watch, cell: sds.NewTrustCell(), serverRoots: serverRoots,
		clock: clk, log: log, failLog: ratelimit.NewLogLimiter(identityLogEvery, 1), metrics: m,
		retry:     loop.Backoff{Base: 250 * time.Millisecond, Max: 30 * time.Second, Jitter: retryJitter},
		localOnly: localOnly,
		ids:       make(map[spiffeid.ID]*identityTrust),
		tds:       make(map[spiffeid.TrustDomain]*tdRoots),
		arrived:   make(chan struct{}),
	}, nil
}

// follow streams the server's trust for id until ctx ends, reconnecting
// with capped exponential backoff and jitter and keeping the last good
// trust meanwhile; then id's trust is forgotten.
func (n *nodeTrust) follow(ctx context.Context, id spiffeid.ID) {
	e := n.register(id)
	defer n.unregister(id, e)
	failures := 0
	for {
		progressed := false
		err := n.watch(ctx, id, func(t workloadTrust, err error) error {
			if err == nil {
				err = n.update(id, e, t)
			}
			if err != nil {
				n.metrics.bundleResponses.WithLabelValues(resultFailure).Inc()
				n.log.Log(ctx, n.failLog.Level(slog.LevelWarn), "the server sent a workload's trust that does not parse; keeping the last good one",
					logattr.SPIFFEID, id.String(), logattr.Error, err.Error())
				return nil
			}
			n.metrics.bundleResponses.WithLabelValues(resultSuccess).Inc()
			progressed = true
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		if progressed {
			failures = 0
		}
		if status.Code(err) == codes.PermissionDenied {
			// The server re-authorizes the stream: this node may no
			// longer act for the workload. Its trust goes, and its
			// certificate with it; a new holder asks again.
			n.forget(e)
			if n.revoke != nil {
				n.revoke(id, err)
			}
		}
		if progressed && status.Code(err) == codes.Unauthenticated {
			// The server ends a stream at its re-authentication when
			// the node's token expired; the file holds a fresh one.
			continue
		}
		failures++
		d := n.retry.Delay(failures, rand.Float64())
		n.metrics.bundleStreamErrs.Inc()
		n.log.Log(ctx, n.failLog.Level(slog.LevelWarn), "lost a workload's trust stream from the certificate service; keeping its last good trust and retrying",
			logattr.SPIFFEID, id.String(), logattr.Error, errString(err), "retry_in", d)
		t := n.clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "stream ended"
	}
	return err.Error()
}

func (n *nodeTrust) register(id spiffeid.ID) *identityTrust {
	n.mu.Lock()
	defer n.mu.Unlock()
	e := &identityTrust{changed: make(chan struct{}), bundlesChanged: make(chan struct{})}
	if old := n.ids[id]; old != nil {
		// A companion of an earlier entry of the same identity that has
		// not returned yet: the newer one takes over.
		old.gone = true
		n.releaseLocked(old)
		close(old.changed)
		close(old.bundlesChanged)
	}
	n.ids[id] = e
	return e
}

// unregister forgets e, id's trust, and the trust domains only it held.
func (n *nodeTrust) unregister(id spiffeid.ID, e *identityTrust) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e.gone {
		return
	}
	e.gone = true
	delete(n.ids, id)
	n.releaseLocked(e)
	close(e.changed)
	close(e.bundlesChanged)
	n.publishLocked()
}

// releaseLocked uncounts e's trust domains. n.mu is held.
func (n *nodeTrust) releaseLocked(e *identityTrust) {
	n.uncountLocked(e.tds)
	e.tds = nil
}

// uncountLocked uncounts tds, forgetting those no identity holds, and
// reports whether it forgot any. n.mu is held.
func (n *nodeTrust) uncountLocked(tds []spiffeid.TrustDomain) (forgot bool) {
	for _, td := range tds {
		if r := n.tds[td]; r != nil {
			if r.refs--; r.refs <= 0 {
				delete(n.tds, td)
				forgot = true
			}
		}
	}
	return forgot
}

// forget drops e's trust: the identity is decided its own trust domain
// only until the server sends it trust again.
func (n *nodeTrust) forget(e *identityTrust) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e.gone || e.policy == nil {
		return
	}
	n.releaseLocked(e)
	e.policy, e.bundles = nil, nil
	close(e.changed)
	e.changed = make(chan struct{})
	close(e.bundlesChanged)
	e.bundlesChanged = make(chan struct{})
	n.publishLocked()
}

// update takes one message of id's trust: its decision as a policy, its
// roots into the node's trust.
func (n *nodeTrust) update(id spiffeid.ID, e *identityTrust, t workloadTrust) error {
	policy, roots, err := n.parse(id, t)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if e.gone {
		return nil
	}
	localChanged, trustChanged := n.countLocked(e, roots)
	if e.policy == nil {
		close(n.arrived)
		n.arrived = make(chan struct{})
	}
	if e.policy == nil || e.policy.TextDigest() != policy.TextDigest() {
		e.policy = policy
		close(e.changed)
		e.changed = make(chan struct{})
	}
	if whole := wholeBundles(t); !slices.EqualFunc(e.bundles, whole, (*spiffebundle.Bundle).Equal) {
		e.bundles = whole
		close(e.bundlesChanged)
		e.bundlesChanged = make(chan struct{})
	}
	if trustChanged {
		// Every workload's server stream sends each rotation: only the
		// first that changes the node's trust wakes the SDS streams.
		n.publishLocked()
	}
	if localChanged && n.serverRoots != nil {
		n.serverRoots(roots[n.local])
	}
	return nil
}

// parse checks one message of id's trust and returns the server's
// decision for id as a policy and the roots per trust domain.
func (n *nodeTrust) parse(id spiffeid.ID, t workloadTrust) (*trustpolicy.Policy, map[spiffeid.TrustDomain][]*x509.Certificate, error) {
	limits := make(peerLimits, len(t.Bundles))
	roots := make(map[spiffeid.TrustDomain][]*x509.Certificate, len(t.Bundles))
	for _, b := range t.Bundles {
		limits[b.TrustDomain()] = nil
		roots[b.TrustDomain()] = b.X509Authorities()
	}
	if len(roots[n.local]) == 0 {
		return nil, nil, fmt.Errorf("no X.509 roots of the local trust domain %s", n.local.Name())
	}
	for td, peers := range t.PeerLimits {
		if _, ok := limits[td]; !ok || td == n.local || len(peers) == 0 {
			return nil, nil, fmt.Errorf("peer limits of trust domain %q, which the message does not grant as a federated trust domain", td.Name())
		}
		limits[td] = peers
	}
	policy, err := relayedPolicy(n.local, id, "server decision for "+id.String(), limits)
	if err != nil {
		return nil, nil, err
	}
	return policy, roots, nil
}

// countLocked makes roots e's trust domains, counted, each with the
// latest roots, and reports whether the local trust domain's roots
// changed and whether the node's trust did (roots, or the trust domains
// held). The new ones are counted before the old are uncounted, so that
// one kept keeps its roots (and nobody is told they changed). n.mu is
// held.
func (n *nodeTrust) countLocked(e *identityTrust, roots map[spiffeid.TrustDomain][]*x509.Certificate) (localChanged, changed bool) {
	old := e.tds
	e.tds = nil
	for td, rs := range roots {
		r := n.tds[td]
		if r == nil {
			r = &tdRoots{}
			n.tds[td] = r
		}
		r.refs++
		if !sameCerts(r.roots, rs) {
			r.roots = rs
			changed = true
			localChanged = localChanged || td == n.local
		}
		e.tds = append(e.tds, td)
	}
	return localChanged, n.uncountLocked(old) || changed
}

// wholeBundles are t's bundles but those granted only for some peers.
func wholeBundles(t workloadTrust) []*spiffebundle.Bundle {
	return slices.DeleteFunc(slices.Clone(t.Bundles), func(b *spiffebundle.Bundle) bool {
		_, limited := t.PeerLimits[b.TrustDomain()]
		return limited
	})
}

// publishLocked sets the cell to the roots of every trust domain held.
// n.mu is held.
func (n *nodeTrust) publishLocked() {
	tds := slices.SortedFunc(maps.Keys(n.tds), func(a, b spiffeid.TrustDomain) int { return strings.Compare(a.Name(), b.Name()) })
	bundles := make([]*x509bundle.Bundle, 0, len(tds))
	for _, td := range tds {
		if rs := n.tds[td].roots; len(rs) > 0 {
			bundles = append(bundles, x509bundle.FromX509Authorities(td, rs))
		}
	}
	if err := n.cell.Set(bundles); err != nil {
		// Bundles of distinct trust domains with roots: cannot fail.
		n.log.Error("publishing the node's trust failed", logattr.Error, err.Error())
	}
}

func sameCerts(a, b []*x509.Certificate) bool {
	return slices.EqualFunc(a, b, func(x, y *x509.Certificate) bool { return x.Equal(y) })
}

// Trust is the node's trust: sds.TrustSource.
func (n *nodeTrust) Trust() *sds.Trust { return n.cell.Trust() }

// Decide is sds.AccessPolicy: the server's decision for ident's
// workload, or its own trust domain only while that has not arrived.
func (n *nodeTrust) Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	sub := trustpolicy.Subject{ID: ident.ID}
	n.mu.Lock()
	defer n.mu.Unlock()
	e := n.ids[ident.ID]
	if e == nil || e.policy == nil {
		return n.localOnly.Decide(sub), n.arrived
	}
	return e.policy.Decide(sub), e.changed
}

// bundlesFor is what id may trust as Workload API bundles (nil before
// its trust arrived, or once it is no longer followed) and a channel
// closed when that changes.
func (n *nodeTrust) bundlesFor(id spiffeid.ID) ([]*spiffebundle.Bundle, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e := n.ids[id]
	if e == nil {
		return nil, n.arrived
	}
	if e.policy == nil {
		return nil, n.arrived
	}
	return e.bundles, e.bundlesChanged
}

// localBundles is the local trust domain's roots as the only bundle,
// or nil before any trust arrived.
func (n *nodeTrust) localBundles() []*spiffebundle.Bundle {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.tds[n.local]
	if r == nil || len(r.roots) == 0 {
		return nil
	}
	return []*spiffebundle.Bundle{spiffebundle.FromX509Authorities(n.local, r.roots)}
}

// errNoTrustYet means a workload's trust has not arrived in time.
var errNoTrustYet = errors.New("the server has not sent this workload's trust yet")

// wait returns once id's first trust has arrived, or errNoTrustYet after
// limit, or ctx's error. id's companion may not have started yet: every
// first arrival wakes it, its own included.
func (n *nodeTrust) wait(ctx context.Context, id spiffeid.ID, limit time.Duration) error {
	t := n.clock.NewTimer(limit)
	defer t.Stop()
	for {
		n.mu.Lock()
		e, wake := n.ids[id], n.arrived
		arrived := e != nil && e.policy != nil
		n.mu.Unlock()
		if arrived {
			return nil
		}
		select {
		case <-wake:
		case <-t.C():
			return errNoTrustYet
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
