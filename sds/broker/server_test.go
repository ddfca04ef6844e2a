package broker

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	delegatedv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/agent/delegatedidentity/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

func allowZtunnel(t testing.TB) *Policy {
	p, err := ParsePolicy([]string{"sa:istio-system/ztunnel"})
	require.NoError(t, err)
	return p
}

var ztunnelCaller = Caller{PID: 7, UID: 0, ServiceAccount: "istio-system/ztunnel", ID: ztun}

// setup is a server whose node has web at pid 42 and by pod, api at pid
// 43, and the broker ztunnel.
func setup(t *testing.T, clk clock.Clock) (*world, *fakeNode, *grpc.ClientConn, *prometheus.Registry) {
	w := newWorld(t)
	webCell := cellOf(t, w.state(t, web))
	n := &fakeNode{
		caller: ztunnelCaller,
		byRef: map[string]*fakeWorkload{
			"pid 42":            {id: web, cell: webCell, gone: make(chan struct{})},
			"pod shop/web-1":    {id: web, cell: webCell},
			"pod uid " + webUID: {id: web, cell: webCell},
			"pid 43":            {id: api, cell: cellOf(t, w.state(t, api))},
		},
		self: &fakeWorkload{id: ztun, cell: cellOf(t, w.state(t, ztun))},
	}
	conn, reg := serve(t, Config{Node: n, Policy: allowZtunnel(t), JWT: &fakeJWT{}, Clock: clk})
	return w, n, conn, reg
}

// A broker gets a workload's SVID with its own bundle and the federated
// ones, as go-spiffe parses them; a new certificate and a bundle change
// reach its open stream.
func TestSubscribeToX509SVID(t *testing.T) {
	w, n, conn, reg := setup(t, nil)
	b, _ := clients(conn)
	ctx, cancel := context.WithCancel(brokerCtx(t.Context()))
	defer cancel()
	stream, err := b.SubscribeToX509SVID(ctx, &brokerpb.SubscribeToX509SVIDRequest{Reference: pidRef(t, 42)})
	require.NoError(t, err)
	resp, err := stream.Recv()
	require.NoError(t, err)
	require.Len(t, resp.Svids, 1)
	got := resp.Svids[0]
	assert.Equal(t, web.String(), got.SpiffeId)
	svid, err := x509svid.ParseRaw(got.X509Svid, got.X509SvidKey)
	require.NoError(t, err)
	assert.Equal(t, web, svid.ID)
	own, err := x509bundle.ParseRaw(tdA, got.Bundle)
	require.NoError(t, err)
	_, _, err = x509svid.Verify(svid.Certificates, own)
	require.NoError(t, err)
	require.Contains(t, resp.FederatedBundles, tdB.IDString())
	assert.NotContains(t, resp.FederatedBundles, tdA.IDString())

	// Rotation: the Cell gets a new certificate.
	cell := n.byRef["pid 42"].cell
	next := w.state(t, web)
	require.NoError(t, cell.Set(next))
	resp, err = stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, next.SVID.Chain[0].Raw, resp.Svids[0].X509Svid)

	// A federated bundle change: b.test's root rotated.
	newB := testcaRoot(t)
	st := next
	st.Bundles = []*spiffebundle.Bundle{w.caA.Bundle(), bundleOf(tdB, newB)}
	require.NoError(t, cell.Set(st))
	resp, err = stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, newB.Raw, resp.FederatedBundles[tdB.IDString()])
	assert.Equal(t, 1.0, testutil.ToFloat64(gauge(reg, "spiffe_broker", "SubscribeToX509SVID")))
	cancel()
	require.Eventually(t, func() bool { return n.holding() == 0 }, 10*time.Second, 10*time.Millisecond, "the stream let go of its workload")
}

// The workload going away (its pid exited) ends its stream with
// NotFound and the Broker API's ErrorInfo; the broker's other streams go on.
func TestStreamEndsWhenWorkloadGone(t *testing.T) {
	_, n, conn, _ := setup(t, nil)
	b, _ := clients(conn)
	ctx := brokerCtx(t.Context())
	gone, err := b.SubscribeToX509SVID(ctx, &brokerpb.SubscribeToX509SVIDRequest{Reference: pidRef(t, 42)})
	require.NoError(t, err)
	_, err = gone.Recv()
	require.NoError(t, err)
	other, err := b.SubscribeToX509Bundles(ctx, &brokerpb.SubscribeToX509BundlesRequest{Reference: pidRef(t, 43)})
	require.NoError(t, err)
	_, err = other.Recv()
	require.NoError(t, err)

	n.set(func(n *fakeNode) {
		close(n.byRef["pid 42"].gone)
		n.byRef["pid 42"] = &fakeWorkload{err: fmt.Errorf("%w: pid 42 exited", ErrNotFound)}
	})
	_, err = gone.Recv()
	requireReason(t, err, codes.NotFound, "WORKLOAD_NOT_FOUND")
	assert.Contains(t, status.Convert(err).Message(), "pid 42 exited")
	require.Eventually(t, func() bool { return n.holding() == 1 }, 10*time.Second, 10*time.Millisecond)
}

// A broker no longer allowed (or a workload no longer entitled) loses
// its open streams at the next recheck.
func TestStreamRechecks(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	_, n, conn, _ := setup(t, clk)
	b, _ := clients(conn)
	stream, err := b.SubscribeToJWTBundles(brokerCtx(t.Context()), &brokerpb.SubscribeToJWTBundlesRequest{Reference: podRef(t, "shop", "web-1", "")})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	require.Eventually(t, clk.HasWaiters, 10*time.Second, 10*time.Millisecond)
	n.set(func(n *fakeNode) { n.caller.ServiceAccount = "shop/intruder" })
	clk.Step(DefaultRecheckInterval)
	_, err = stream.Recv()
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "matches none of the broker rules (sa:istio-system/ztunnel)")
}

func TestRefusals(t *testing.T) {
	_, n, conn, reg := setup(t, nil)
	b, _ := clients(conn)
	ctx := brokerCtx(t.Context())
	recv := func(ctx context.Context, ref *brokerpb.WorkloadReference) error {
		s, err := b.SubscribeToX509SVID(ctx, &brokerpb.SubscribeToX509SVIDRequest{Reference: ref})
		require.NoError(t, err)
		_, err = s.Recv()
		return err
	}

	t.Run("no security header", func(t *testing.T) {
		err := recv(t.Context(), pidRef(t, 42))
		require.Equal(t, codes.InvalidArgument, status.Code(err))
		assert.Contains(t, status.Convert(err).Message(), Header)
	})
	t.Run("no reference", func(t *testing.T) {
		requireReason(t, recv(ctx, nil), codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID")
	})
	t.Run("unknown reference type", func(t *testing.T) {
		a, err := anypb.New(&brokerpb.KubernetesObjectKey{Name: "x"})
		require.NoError(t, err)
		requireReason(t, recv(ctx, &brokerpb.WorkloadReference{Reference: a}), codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID")
	})
	t.Run("not on this node", func(t *testing.T) {
		requireReason(t, recv(ctx, pidRef(t, 99)), codes.NotFound, "WORKLOAD_NOT_FOUND")
	})
	t.Run("not entitled", func(t *testing.T) {
		n.set(func(n *fakeNode) {
			n.byRef["pid 44"] = &fakeWorkload{err: fmt.Errorf("no rule gives pod shop/batch an identity")}
		})
		err := recv(ctx, pidRef(t, 44))
		requireReason(t, err, codes.PermissionDenied, "WORKLOAD_NOT_ENTITLED")
		assert.Contains(t, status.Convert(err).Message(), "no rule gives pod shop/batch an identity")
	})
	t.Run("attestation cannot decide", func(t *testing.T) {
		n.set(func(n *fakeNode) {
			n.byRef["pid 45"] = &fakeWorkload{err: fmt.Errorf("%w: the pods of this node cannot be read", authn.ErrUnavailable)}
		})
		require.Equal(t, codes.Unavailable, status.Code(recv(ctx, pidRef(t, 45))))
	})
	t.Run("not a broker", func(t *testing.T) {
		n.set(func(n *fakeNode) { n.caller = Caller{PID: 9, UID: 1000, ServiceAccount: "shop/web", ID: web} })
		defer n.set(func(n *fakeNode) { n.caller = ztunnelCaller })
		resolved := n.resolved
		err := recv(ctx, pidRef(t, 42))
		require.Equal(t, codes.PermissionDenied, status.Code(err))
		assert.Contains(t, status.Convert(err).Message(), "pid 9 (uid 1000, service account shop/web, spiffe://a.test/ns/shop/sa/web) matches none of the broker rules")
		assert.Equal(t, resolved, n.resolved, "a caller that may not broker has nothing resolved")
		_, err = b.FetchJWTSVID(ctx, &brokerpb.FetchJWTSVIDRequest{Reference: pidRef(t, 42), Audience: []string{"x"}})
		require.Equal(t, codes.PermissionDenied, status.Code(err))
	})
	assert.Equal(t, 1.0, testutil.ToFloat64(requests(reg, "spiffe_broker", "SubscribeToX509SVID", codes.NotFound)))
	assert.Equal(t, 0, n.holding())
}

func requireReason(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	st := status.Convert(err)
	require.Equal(t, code, st.Code(), "%v", err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			assert.Equal(t, reason, info.Reason)
			assert.Equal(t, "spiffe.io", info.Domain)
			return
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
}

func TestFetchJWTSVID(t *testing.T) {
	_, _, conn, _ := setup(t, nil)
	b, _ := clients(conn)
	ctx := brokerCtx(t.Context())
	resp, err := b.FetchJWTSVID(ctx, &brokerpb.FetchJWTSVIDRequest{Reference: podRef(t, "", "", webUID), Audience: []string{"sts.example"}})
	require.NoError(t, err)
	require.Len(t, resp.Svids, 1)
	assert.Equal(t, web.String(), resp.Svids[0].SpiffeId)
	assert.Equal(t, "token-for-"+web.String(), resp.Svids[0].Svid)

	_, err = b.FetchJWTSVID(ctx, &brokerpb.FetchJWTSVIDRequest{Reference: pidRef(t, 42), Audience: []string{"x"}, SpiffeId: api.String()})
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "its identity is "+web.String())
	_, err = b.FetchJWTSVID(ctx, &brokerpb.FetchJWTSVIDRequest{Reference: pidRef(t, 42)})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

// SPIRE's Delegated Identity API: SVIDs by pid or by selectors naming a
// pod, federates_with listing the workload's other trust domains, and the
// bundle streams carrying the broker's own trust.
func TestDelegatedIdentity(t *testing.T) {
	w, n, conn, _ := setup(t, nil)
	_, d := clients(conn)
	ctx := t.Context()

	stream, err := d.SubscribeToX509SVIDs(ctx, &delegatedv1.SubscribeToX509SVIDsRequest{Pid: 42})
	require.NoError(t, err)
	resp, err := stream.Recv()
	require.NoError(t, err)
	require.Len(t, resp.X509Svids, 1)
	got := resp.X509Svids[0]
	assert.Equal(t, &spiretypes.SPIFFEID{TrustDomain: "a.test", Path: "/ns/shop/sa/web"}, got.X509Svid.Id)
	leaf, err := x509.ParseCertificate(got.X509Svid.CertChain[0])
	require.NoError(t, err)
	assert.Equal(t, leaf.NotAfter.Unix(), got.X509Svid.ExpiresAt)
	_, err = x509.ParsePKCS8PrivateKey(got.X509SvidKey)
	require.NoError(t, err)
	assert.Equal(t, []string{tdB.IDString()}, resp.FederatesWith)

	bySel, err := d.SubscribeToX509SVIDs(ctx, &delegatedv1.SubscribeToX509SVIDsRequest{Selectors: []*spiretypes.Selector{
		{Type: "k8s", Value: "ns:shop"}, {Type: "k8s", Value: "pod-name:web-1"}, {Type: "k8s", Value: "sa:web"},
	}})
	require.NoError(t, err)
	resp, err = bySel.Recv()
	require.NoError(t, err)
	assert.Equal(t, "/ns/shop/sa/web", resp.X509Svids[0].X509Svid.Id.Path)

	bundles, err := d.SubscribeToX509Bundles(ctx, &delegatedv1.SubscribeToX509BundlesRequest{})
	require.NoError(t, err)
	br, err := bundles.Recv()
	require.NoError(t, err)
	assert.Equal(t, concatDER(w.caA.Bundle().X509Authorities()), br.CaCertificates[tdA.IDString()])
	assert.Contains(t, br.CaCertificates, tdB.IDString())

	for name, req := range map[string]*delegatedv1.SubscribeToX509SVIDsRequest{
		"both":            {Pid: 42, Selectors: []*spiretypes.Selector{{Type: "k8s", Value: "pod-uid:" + webUID}}},
		"unix selector":   {Selectors: []*spiretypes.Selector{{Type: "unix", Value: "uid:0"}}},
		"no pod selector": {Selectors: []*spiretypes.Selector{{Type: "k8s", Value: "sa:web"}}},
	} {
		s, err := d.SubscribeToX509SVIDs(ctx, req)
		require.NoError(t, err)
		_, err = s.Recv()
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}

	jwts, err := d.FetchJWTSVIDs(ctx, &delegatedv1.FetchJWTSVIDsRequest{Pid: 43, Audience: []string{"vault"}})
	require.NoError(t, err)
	require.Len(t, jwts.Svids, 1)
	assert.Equal(t, "/ns/shop/sa/api", jwts.Svids[0].Id.Path)

	// A broker without an identity of its own gets no bundle stream, and
	// is told why.
	n.set(func(n *fakeNode) { n.self = &fakeWorkload{err: fmt.Errorf("no rule gives uid 0 an identity")} })
	bundles, err = d.SubscribeToX509Bundles(ctx, &delegatedv1.SubscribeToX509BundlesRequest{})
	require.NoError(t, err)
	_, err = bundles.Recv()
	require.Equal(t, codes.PermissionDenied, status.Code(err))
}

// Broker API bundle streams carry the workload's trust domains, its own
// included, keyed by trust domain SPIFFE ID.
func TestSubscribeToBundles(t *testing.T) {
	w, _, conn, _ := setup(t, nil)
	b, _ := clients(conn)
	ctx := brokerCtx(t.Context())
	xs, err := b.SubscribeToX509Bundles(ctx, &brokerpb.SubscribeToX509BundlesRequest{Reference: pidRef(t, 43)})
	require.NoError(t, err)
	x, err := xs.Recv()
	require.NoError(t, err)
	assert.Equal(t, map[string][]byte{
		tdA.IDString(): concatDER(w.caA.Bundle().X509Authorities()),
		tdB.IDString(): concatDER(w.caB.Bundle().X509Authorities()),
	}, x.Bundles)
}

func TestNewRefuses(t *testing.T) {
	_, err := New(Config{Node: &fakeNode{}})
	require.ErrorContains(t, err, "--broker-allow")
	_, err = New(Config{Policy: allowZtunnel(t)})
	require.Error(t, err)
}

var _ wapi.Source = (*wapi.Cell)(nil)

// A workload with its own Again (a pinned process) is resolved again
// through it, never through its reference: the pid may name another
// process by then.
func TestStreamResolvesAgainThroughWorkload(t *testing.T) {
	_, n, conn, _ := setup(t, nil)
	var agains atomic.Int32
	gone := make(chan struct{})
	n.set(func(n *fakeNode) {
		w := n.byRef["pid 42"]
		w.gone = gone
		w.again = func() error {
			agains.Add(1)
			return fmt.Errorf("%w: pid 42 exited", ErrNotFound)
		}
	})
	b, _ := clients(conn)
	s, err := b.SubscribeToX509SVID(brokerCtx(t.Context()), &brokerpb.SubscribeToX509SVIDRequest{Reference: pidRef(t, 42)})
	require.NoError(t, err)
	_, err = s.Recv()
	require.NoError(t, err)
	resolved := func() int {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.resolved
	}()
	close(gone)
	_, err = s.Recv()
	requireReason(t, err, codes.NotFound, "WORKLOAD_NOT_FOUND")
	n.mu.Lock()
	defer n.mu.Unlock()
	assert.Equal(t, int32(1), agains.Load())
	assert.Equal(t, resolved, n.resolved, "the reference was not resolved again")
}

// Streams past MaxStreams are refused with ResourceExhausted, and one
// closing makes room.
func TestMaxStreams(t *testing.T) {
	w := newWorld(t)
	n := &fakeNode{caller: ztunnelCaller, byRef: map[string]*fakeWorkload{"pid 42": {id: web, cell: cellOf(t, w.state(t, web))}}}
	conn, _ := serve(t, Config{Node: n, Policy: allowZtunnel(t), MaxStreams: 2})
	b, _ := clients(conn)
	open := func(ctx context.Context) error {
		s, err := b.SubscribeToX509SVID(brokerCtx(ctx), &brokerpb.SubscribeToX509SVIDRequest{Reference: pidRef(t, 42)})
		require.NoError(t, err)
		_, err = s.Recv()
		return err
	}
	ctx1, cancel1 := context.WithCancel(t.Context())
	require.NoError(t, open(ctx1))
	require.NoError(t, open(t.Context()))
	err := open(t.Context())
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "2 streams are open")
	cancel1()
	require.Eventually(t, func() bool { return open(t.Context()) == nil }, 10*time.Second, 10*time.Millisecond, "a closed stream makes room")
}

// A refusal wrapping the certificate service's status is mapped by its
// sentinel (§4.8), not passed on with the upstream's code.
func TestRefusalsWrappingUpstreamStatus(t *testing.T) {
	_, n, conn, _ := setup(t, nil)
	n.set(func(n *fakeNode) {
		n.byRef["pid 50"] = &fakeWorkload{err: fmt.Errorf("%w: %w", ErrNotEntitled, status.Error(codes.PermissionDenied, "no running pod of service account shop/x is on node a"))}
		n.byRef["pid 51"] = &fakeWorkload{err: fmt.Errorf("%w: %w", authn.ErrUnavailable, status.Error(codes.ResourceExhausted, "rate limited"))}
	})
	b, _ := clients(conn)
	recv := func(pid int32) error {
		s, err := b.SubscribeToX509SVID(brokerCtx(t.Context()), &brokerpb.SubscribeToX509SVIDRequest{Reference: pidRef(t, pid)})
		require.NoError(t, err)
		_, err = s.Recv()
		return err
	}
	requireReason(t, recv(50), codes.PermissionDenied, "WORKLOAD_NOT_ENTITLED")
	require.Equal(t, codes.Unavailable, status.Code(recv(51)))
}

// While the node cannot decide (its pods cannot be read), an open
// stream stays on what it resolved and goes on pushing; a workload whose
// identity changed ends its stream.
func TestRecheckOutageAndIdentityChange(t *testing.T) {
	w, n, conn, _ := setup(t, nil)
	gone := make(chan struct{})
	var cell *wapi.Cell
	n.set(func(n *fakeNode) {
		cell = n.byRef["pod shop/web-1"].cell
		n.byRef["pod shop/web-1"] = &fakeWorkload{id: web, cell: cell, gone: gone}
	})
	b, _ := clients(conn)
	s, err := b.SubscribeToX509SVID(brokerCtx(t.Context()), &brokerpb.SubscribeToX509SVIDRequest{Reference: podRef(t, "shop", "web-1", "")})
	require.NoError(t, err)
	_, err = s.Recv()
	require.NoError(t, err)

	n.set(func(n *fakeNode) {
		n.byRef["pod shop/web-1"] = &fakeWorkload{err: fmt.Errorf("%w: the pods of this node cannot be read", authn.ErrUnavailable)}
	})
	resolved := func() int {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.resolved
	}
	before := resolved()
	close(gone)
	require.Eventually(t, func() bool { return resolved() > before }, 10*time.Second, 10*time.Millisecond, "the stream resolved its pod again")
	next := w.state(t, web)
	require.NoError(t, cell.Set(next))
	resp, err := s.Recv()
	require.NoError(t, err, "the stream goes on through the outage")
	assert.Equal(t, next.SVID.Chain[0].Raw, resp.Svids[0].X509Svid)

	// The identity map now gives the pod api's identity.
	clk := clocktesting.NewFakeClock(time.Now())
	_, n2, conn2, _ := setup(t, clk)
	gone2 := make(chan struct{})
	n2.set(func(n *fakeNode) { n.byRef["pod shop/web-1"].gone = gone2 })
	b2, _ := clients(conn2)
	s2, err := b2.SubscribeToX509SVID(brokerCtx(t.Context()), &brokerpb.SubscribeToX509SVIDRequest{Reference: podRef(t, "shop", "web-1", "")})
	require.NoError(t, err)
	_, err = s2.Recv()
	require.NoError(t, err)
	n2.set(func(n *fakeNode) { n.byRef["pod shop/web-1"] = n.byRef["pid 43"] })
	close(gone2)
	_, err = s2.Recv()
	requireReason(t, err, codes.PermissionDenied, "WORKLOAD_NOT_ENTITLED")
	assert.Contains(t, status.Convert(err).Message(), "is now "+api.String())
}
