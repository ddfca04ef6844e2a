package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// fakeTrustServer stands in for the server's WatchBundles per workload:
// the test sends each identity's messages on its channel.
type fakeTrustServer struct {
	streams chan fakeTrustStream
}

type fakeTrustStream struct {
	id   spiffeid.ID
	msgs chan fakeTrustMsg
	end  chan error
}

type fakeTrustMsg struct {
	t    workloadTrust
	err  error
	done chan struct{} // closed once fn handled it
}

func (f *fakeTrustServer) watch(ctx context.Context, id spiffeid.ID, fn func(workloadTrust, error) error) error {
	s := fakeTrustStream{id: id, msgs: make(chan fakeTrustMsg), end: make(chan error)}
	select {
	case f.streams <- s:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		select {
		case m := <-s.msgs:
			err := fn(m.t, m.err)
			close(m.done)
			if err != nil {
				return err
			}
		case err := <-s.end:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// next is the stream the next follow opens.
func (f *fakeTrustServer) next(t *testing.T) fakeTrustStream {
	t.Helper()
	select {
	case s := <-f.streams:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no trust stream opened")
		return fakeTrustStream{}
	}
}

// send delivers m and waits until follow handled it.
func (s fakeTrustStream) send(t *testing.T, m fakeTrustMsg) {
	t.Helper()
	m.done = make(chan struct{})
	s.msgs <- m
	<-m.done
}

type nodeTrustFixture struct {
	nt      *nodeTrust
	srv     *fakeTrustServer
	clock   *clocktesting.FakeClock
	reg     *prometheus.Registry
	local   *testca.CA
	b, c    *testca.CA
	servers [][]*x509.Certificate
}

func newNodeTrustFixture(t *testing.T) *nodeTrustFixture {
	t.Helper()
	f := &nodeTrustFixture{
		srv:   &fakeTrustServer{streams: make(chan fakeTrustStream)},
		clock: clocktesting.NewFakeClock(time.Now()),
		reg:   prometheus.NewRegistry(),
		local: testca.New(t, tdA.Name()), b: testca.New(t, tdB.Name()), c: testca.New(t, tdC.Name()),
	}
	m, err := newMetrics(f.reg)
	require.NoError(t, err)
	f.nt, err = newNodeTrust(tdA, f.srv.watch, func(roots []*x509.Certificate) { f.servers = append(f.servers, roots) },
		f.clock, slog.New(slog.DiscardHandler), m)
	require.NoError(t, err)
	return f
}

// follow runs the companion of id until the returned stop.
func (f *nodeTrustFixture) follow(t *testing.T, id spiffeid.ID) (fakeTrustStream, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.nt.follow(ctx, id) }()
	s := f.srv.next(t)
	require.Equal(t, id, s.id)
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return s, stop
}

func wtrust(bundles []*spiffebundle.Bundle, limits map[spiffeid.TrustDomain][]string) fakeTrustMsg {
	return fakeTrustMsg{t: workloadTrust{Bundles: bundles, PeerLimits: limits}}
}

func trustDomainsIn(n *nodeTrust) []string {
	var out []string
	for _, b := range n.Trust().Bundles {
		out = append(out, b.TrustDomain().Name())
	}
	return out
}

// Each workload is decided as the server decided it: web trusts b.test
// whole, api trusts only one peer of c.test, and neither gets the other's
// grant; the node's trust is the union while both are held, and a trust
// domain leaves it with the last workload that held it.
func TestNodeTrustDecidesPerWorkload(t *testing.T) {
	f := newNodeTrustFixture(t)
	web, stopWeb := f.follow(t, webID)
	api, _ := f.follow(t, apiID)
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), f.b.Bundle()}, nil))
	api.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), f.c.Bundle()},
		map[spiffeid.TrustDomain][]string{tdC: {"spiffe://c.test/ns/pay/sa/gateway"}}))
	require.NoError(t, f.nt.wait(t.Context(), webID, time.Hour))
	require.NoError(t, f.nt.wait(t.Context(), apiID, time.Hour))

	dWeb, _ := f.nt.Decide(authn.Identity{ID: webID})
	g, ok := dWeb.Allows(tdB)
	assert.True(t, ok)
	assert.Empty(t, g.Peers, "web trusts every member of b.test")
	_, ok = dWeb.Allows(tdC)
	assert.False(t, ok, "web was not granted c.test")

	dAPI, _ := f.nt.Decide(authn.Identity{ID: apiID})
	g, ok = dAPI.Allows(tdC)
	require.True(t, ok)
	require.Len(t, g.Peers, 1)
	assert.Equal(t, "spiffe://c.test/ns/pay/sa/gateway", g.Peers[0].String())
	_, ok = dAPI.Allows(tdB)
	assert.False(t, ok, "api was not granted b.test")

	assert.Equal(t, []string{"a.test", "b.test", "c.test"}, trustDomainsIn(f.nt))
	stopWeb()
	assert.Equal(t, []string{"a.test", "c.test"}, trustDomainsIn(f.nt), "b.test left with web")
	d, _ := f.nt.Decide(authn.Identity{ID: webID})
	_, ok = d.Allows(tdB)
	assert.False(t, ok, "a workload no longer followed is decided its own trust domain only")
}

// Before its trust arrives a workload is decided its own trust domain
// only, and the channel handed out fires when it arrives; a policy change
// fires the workload's channel, and not another's.
func TestNodeTrustDecisionChanges(t *testing.T) {
	f := newNodeTrustFixture(t)
	web, _ := f.follow(t, webID)
	api, _ := f.follow(t, apiID)
	d, arrived := f.nt.Decide(authn.Identity{ID: webID})
	assert.Empty(t, d.Grants)
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle()}, nil))
	api.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle()}, nil))
	assertClosed(t, arrived, "the first trust wakes those decided before it")

	_, webCh := f.nt.Decide(authn.Identity{ID: webID})
	_, apiCh := f.nt.Decide(authn.Identity{ID: apiID})
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), f.b.Bundle()}, nil))
	assertClosed(t, webCh, "web's decision changed")
	assertOpen(t, apiCh, "api's did not")

	_, webCh = f.nt.Decide(authn.Identity{ID: webID})
	rotated := testca.New(t, tdB.Name())
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), rotated.Bundle()}, nil))
	assertOpen(t, webCh, "new roots are not a new decision: the trust's own channel says so")
	for _, b := range f.nt.Trust().Bundles {
		if b.TrustDomain() == tdB {
			assert.True(t, b.X509Authorities()[0].Equal(rotated.Bundle().X509Authorities()[0]), "the latest roots the server sent")
		}
	}
}

// A message that does not parse is counted and logged and the last good
// trust stays; an outage keeps it too, and the stream is opened again
// after a backoff.
func TestNodeTrustKeepsTheLastGood(t *testing.T) {
	f := newNodeTrustFixture(t)
	web, _ := f.follow(t, webID)
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), f.b.Bundle()}, nil))
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle()}, map[spiffeid.TrustDomain][]string{tdC: {"spiffe://c.test/x"}}))
	web.send(t, fakeTrustMsg{err: errors.New("bundle map does not parse")})
	web.send(t, wtrust([]*spiffebundle.Bundle{f.b.Bundle()}, nil))
	assert.Equal(t, 3.0, testutil.ToFloat64(f.nt.metrics.bundleResponses.WithLabelValues(resultFailure)),
		"peer limits of a trust domain not granted, an unparsable map, no local roots")
	d, _ := f.nt.Decide(authn.Identity{ID: webID})
	_, ok := d.Allows(tdB)
	assert.True(t, ok, "the last good decision stays")

	web.end <- errors.New("connection reset")
	require.Eventually(t, func() bool { return f.clock.HasWaiters() }, 10*time.Second, time.Millisecond)
	d, _ = f.nt.Decide(authn.Identity{ID: webID})
	_, ok = d.Allows(tdB)
	assert.True(t, ok, "kept through the outage")
	assert.Equal(t, []string{"a.test", "b.test"}, trustDomainsIn(f.nt))
	assert.Equal(t, 1.0, testutil.ToFloat64(f.nt.metrics.bundleStreamErrs))
	f.clock.Step(time.Minute)
	again := f.srv.next(t)
	assert.Equal(t, webID, again.id, "reconnected after the backoff")
}

// The local trust domain's roots reach the node's own client when they
// change, so it keeps verifying the server across a rotation.
func TestNodeTrustFeedsTheServerRoots(t *testing.T) {
	f := newNodeTrustFixture(t)
	web, _ := f.follow(t, webID)
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle()}, nil))
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), f.b.Bundle()}, nil))
	require.Len(t, f.servers, 1, "told once: the local roots did not change")
	next := testca.New(t, tdA.Name())
	web.send(t, wtrust([]*spiffebundle.Bundle{next.Bundle()}, nil))
	require.Len(t, f.servers, 2)
	assert.True(t, f.servers[1][0].Equal(next.Bundle().X509Authorities()[0]))
}

// wait returns once the workload's trust arrived, whether its companion
// had started or not, and gives up after its limit.
func TestNodeTrustWait(t *testing.T) {
	f := newNodeTrustFixture(t)
	waited := make(chan error, 1)
	go func() { waited <- f.nt.wait(t.Context(), webID, time.Minute) }()
	web, _ := f.follow(t, webID)
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle()}, nil))
	require.NoError(t, <-waited)

	go func() { waited <- f.nt.wait(t.Context(), apiID, time.Minute) }()
	require.Eventually(t, func() bool { return f.clock.HasWaiters() }, 10*time.Second, time.Millisecond)
	f.clock.Step(time.Minute)
	assert.ErrorIs(t, <-waited, errNoTrustYet)
}

func assertClosed(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	default:
		t.Error(msg)
	}
}

func assertOpen(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
		t.Error(msg)
	default:
	}
}

// switchingAttestor attests every caller as whatever id holds now.
type switchingAttestor struct{ id atomic.Pointer[spiffeid.ID] }

func (s *switchingAttestor) Authenticate(context.Context, authn.Request) (authn.Identity, error) {
	return authn.Identity{ID: *s.id.Load(), Method: authn.MethodAttestation}, nil
}

// A stream re-attested as another identity ends (not attested, never
// "unavailable"), even when the new identity cannot be had right now: it
// is never kept on the identity it no longer has.
func TestNodeAuthenticatorIdentityChanged(t *testing.T) {
	f := newNodeTrustFixture(t)
	fetcher := newFakeFetcher(t, time.Hour)
	cache := newTestCache(t, IdentityCacheConfig{Fetcher: fetcher, Rand: fixedRand(0.5), Companion: f.nt.follow})
	startServing(t, cache.Run)
	att := &switchingAttestor{}
	att.id.Store(&webID)
	n := &nodeAuthenticator{attested: att, cache: cache, trust: f.nt}

	ctx, end := context.WithCancel(t.Context())
	defer end()
	done := make(chan error, 1)
	go func() {
		_, err := n.Authenticate(ctx, authn.Request{})
		done <- err
	}()
	f.srv.next(t).send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle()}, nil))
	require.NoError(t, <-done)

	fetcher.setFail(fmt.Errorf("%w: the server is unreachable", authn.ErrUnavailable))
	att.id.Store(&apiID)
	_, err := n.Authenticate(ctx, authn.Request{})
	require.ErrorIs(t, err, authn.ErrNotAttested)
	assert.NotErrorIs(t, err, authn.ErrUnavailable, "a definitive refusal: the stream ends")
	assert.ErrorContains(t, err, "reconnect")
	assert.Zero(t, fetcher.callsFor(apiID), "the new identity is left to the new stream")
}

// A trust stream the server ends with PermissionDenied (it re-authorizes
// every stream: the workload's pod left the node) takes the workload's
// trust and certificate away at once: it is decided its own trust
// domain only, and the cache is told to stop serving it.
func TestNodeTrustRevoked(t *testing.T) {
	f := newNodeTrustFixture(t)
	var revoked []spiffeid.ID
	f.nt.revoke = func(id spiffeid.ID, err error) {
		assert.Equal(t, codes.PermissionDenied, status.Code(err))
		revoked = append(revoked, id)
	}
	web, _ := f.follow(t, webID)
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), f.b.Bundle()}, nil))
	_, ch := f.nt.Decide(authn.Identity{ID: webID})
	web.end <- status.Error(codes.PermissionDenied, "no pod of shop/web on this node")
	require.Eventually(t, func() bool { return f.clock.HasWaiters() }, 10*time.Second, time.Millisecond, "follow backs off")
	assertClosed(t, ch, "streams re-decide")
	d, _ := f.nt.Decide(authn.Identity{ID: webID})
	_, ok := d.Allows(tdB)
	assert.False(t, ok, "its trust is gone")
	assert.Equal(t, []spiffeid.ID{webID}, revoked)
	assert.Empty(t, trustDomainsIn(f.nt), "no identity holds any trust now")
}

// The node's trust streams are spread over connections of at most
// streamsPerConn each (the server serves 128 calls per connection; a
// stream past that would wait forever), a freed slot reused before a new
// connection is dialed.
func TestNodeConnsSpreadStreams(t *testing.T) {
	dials := 0
	p := &nodeConns{dial: func() (*grpc.ClientConn, error) {
		dials++
		return grpc.NewClient("passthrough:///ca", grpc.WithTransportCredentials(insecure.NewCredentials()))
	}}
	defer p.Close()
	var taken []*pooledConn
	for range 2*streamsPerConn + 1 {
		c, err := p.take()
		require.NoError(t, err)
		taken = append(taken, c)
	}
	assert.Equal(t, 3, dials)
	p.put(taken[0])
	c, err := p.take()
	require.NoError(t, err)
	assert.Same(t, taken[0], c, "a freed slot first")
	assert.Equal(t, 3, dials)
	p.Close()
	_, err = p.take()
	assert.Error(t, err, "none once the agent stops")
}

// Every held identity's server stream sends each rotation: only a message
// that changes the node's trust wakes the SDS streams, not the thousand
// after it that carry the same roots.
func TestNodeTrustPublishesChangesOnly(t *testing.T) {
	f := newNodeTrustFixture(t)
	web, _ := f.follow(t, webID)
	api, _ := f.follow(t, apiID)
	msg := wtrust([]*spiffebundle.Bundle{f.local.Bundle(), f.b.Bundle()}, nil)
	web.send(t, msg)
	before := f.nt.Trust()
	api.send(t, msg)
	assertOpen(t, before.Changed, "the same roots from another workload's stream change nothing")
	rotated := testca.New(t, tdB.Name())
	api.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), rotated.Bundle()}, nil))
	assertClosed(t, before.Changed, "a rotation does")
	after := f.nt.Trust()
	web.send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle(), rotated.Bundle()}, nil))
	assertOpen(t, after.Changed, "and once only")
}

// A Workload API Cell is fed from one cache entry: once the identity was
// revoked and granted again (a new entry), callers get a new Cell, never
// the revoked one, while its last holders still have it.
func TestNodeWorkloadsCellFollowsTheEntry(t *testing.T) {
	f := newNodeTrustFixture(t)
	cache := newTestCache(t, IdentityCacheConfig{Fetcher: newFakeFetcher(t, time.Hour), Rand: fixedRand(0.5)})
	startServing(t, cache.Run)
	w := &nodeWorkloads{cache: cache, trust: f.nt, log: slog.New(slog.DiscardHandler)}
	h1, err := cache.Acquire(t.Context(), webID)
	require.NoError(t, err)
	defer h1.Release()
	c1 := w.ref(h1)
	defer w.unref(c1)

	cache.Revoke(webID, errors.New("revoked by the test"))
	h2, err := cache.Acquire(t.Context(), webID)
	require.NoError(t, err)
	defer h2.Release()
	c2 := w.ref(h2)
	defer w.unref(c2)
	assert.NotSame(t, c1, c2, "a new Cell for the new entry")
	again := w.ref(h2)
	defer w.unref(again)
	assert.Same(t, c2, again, "shared by its callers")
}
