package certservice_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// A node agent (ztunnel's service account, its token bound to its pod)
// and workloads of its node.
var (
	nodeAgentID = spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")
	shopWeb     = spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/web")
	shopAPI     = spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/api")
)

const nodeAgentToken = "node-agent-token-0123456789"

// nodeAgentTokens proves nodeAgentToken as TokenReview would: a
// kubernetes-jwt identity with its grant, bound to the agent's pod
// (nodeAgentPod).
var nodeAgentTokens = authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
	if r.BearerToken != nodeAgentToken {
		return authn.Identity{}, authn.ErrNoCredentials
	}
	return authn.Identity{ID: nodeAgentID, Method: authn.MethodKubernetesJWT,
		Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "istio-system/ztunnel"},
		Pod:   authn.PodRef{Namespace: "istio-system", Name: nodeAgentPod, UID: nodeAgentPodUID}}, nil
})

// The node agent's pod, on node-a, as a pod informer would see it.
const (
	nodeAgentPod    = "ztunnel-a"
	nodeAgentPodUID = "uid-ztunnel-a"
)

// nodePods is an Impersonator whose node's pods the test changes: the
// node agent may act for the workloads listed, nothing else may; err,
// when set, is every answer (a node authorizer that cannot decide).
type nodePods struct {
	mu   sync.Mutex
	on   map[spiffeid.ID]bool
	err  error
	asks int
}

func newNodePods(ids ...spiffeid.ID) *nodePods {
	n := &nodePods{on: map[spiffeid.ID]bool{}}
	for _, id := range ids {
		n.on[id] = true
	}
	return n
}

func (n *nodePods) AuthorizeImpersonation(_ context.Context, caller authn.Identity, target spiffeid.ID) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.asks++
	switch {
	case n.err != nil:
		return n.err
	case caller.ID != nodeAgentID:
		return errors.New("not a node agent")
	case !n.on[target]:
		return fmt.Errorf("no pod of %s on this node", target)
	}
	return nil
}

func (n *nodePods) set(id spiffeid.ID, on bool, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.on[id], n.err = on, err
}

func (n *nodePods) asked() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.asks
}

// shopPolicy grants the shop namespace allowed.example whole and
// withheld.example for two peers only, and the node agents' namespace
// denied.example: the agent's own grant must not leak into a workload's
// trust.
func shopPolicy(t *testing.T, withheldPeers ...string) *trustpolicy.Policy {
	t.Helper()
	if withheldPeers == nil {
		withheldPeers = []string{"spiffe://withheld.example/ns/b/*", "spiffe://withheld.example/api"}
	}
	p, err := trustpolicy.Compile(td, trustpolicy.DefaultDeny, []trustpolicy.Rule{{
		Name:      "shop",
		Workloads: []trustpolicy.Selector{{Namespace: "shop"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{
			{TrustDomain: allowedTD.Name()},
			{TrustDomain: withheldTD.Name(), Peers: withheldPeers},
		},
	}, {
		Name:         "agents",
		Workloads:    []trustpolicy.Selector{{Namespace: "istio-system"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: deniedTD.Name()}},
	}})
	require.NoError(t, err)
	return p
}

// impersonationFixture serves WatchBundles to the node agent (token) and
// workloads (X509-SVIDs) under shopPolicy, with pods the test moves.
type impersonationFixture struct {
	*watchFixture
	pods   *nodePods
	policy *fakePolicy
}

func newImpersonationFixture(t *testing.T, mutate func(*certservice.Config)) *impersonationFixture {
	t.Helper()
	f := &impersonationFixture{pods: newNodePods(shopWeb, shopAPI)}
	f.policy = &fakePolicy{p: shopPolicy(t), ch: make(chan struct{})}
	f.watchFixture = newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Authenticator = append(cfg.Authenticator.(authn.Chain), nodeAgentTokens)
		cfg.Impersonator = f.pods
		cfg.Policy = f.policy
		if mutate != nil {
			mutate(cfg)
		}
	})
	return f
}

// watchFor opens a stream of c asking for req.
func watchFor(t *testing.T, c identityapi.IdentityServiceClient, req *identityapi.WatchBundlesRequest) grpc.ServerStreamingClient[identityapi.WatchBundlesResponse] {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	stream, err := c.WatchBundles(ctx, req)
	require.NoError(t, err)
	return stream
}

// recvMsg receives one message: recvMap's, and the message itself.
func recvMsg(t *testing.T, stream grpc.ServerStreamingClient[identityapi.WatchBundlesResponse]) ([]string, *identityapi.WatchBundlesResponse) {
	t.Helper()
	msg, err := stream.Recv()
	require.NoError(t, err)
	got, err := parseNames(msg)
	require.NoError(t, err)
	return got, msg
}

func peerLimits(msg *identityapi.WatchBundlesResponse) map[string][]string {
	out := map[string][]string{}
	for _, l := range msg.GetPeerLimits() {
		out[l.GetTrustDomain()] = l.GetPeers()
	}
	return out
}

// A node agent gets the workload's trust, decided as for the workload's
// certificate: with peer_limits the peer-limited trust domain is in the
// map and its peers listed; without, it is withheld, as for the workload
// itself.
func TestWatchBundlesImpersonated(t *testing.T) {
	f := newImpersonationFixture(t, nil)
	agent := f.identityClient(t, nil, nodeAgentToken)

	got, msg := recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String(), PeerLimits: true}))
	assert.Equal(t, shopWeb.String(), msg.GetSpiffeId(), "whose trust this is")
	assert.ElementsMatch(t, []string{"allowed.example", "example.org", "withheld.example"}, got, "not the agent's denied.example")
	assert.Empty(t, msg.GetWithheldTrustDomains())
	assert.Equal(t, map[string][]string{"withheld.example": {"spiffe://withheld.example/api", "spiffe://withheld.example/ns/b/*"}}, peerLimits(msg), "sorted peers")

	// The same decision on the same trust, rendered apart: the rendering
	// cache keys on peer_limits.
	got, msg = recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String()}))
	assert.Equal(t, shopWeb.String(), msg.GetSpiffeId())
	assert.ElementsMatch(t, []string{"allowed.example", "example.org"}, got)
	assert.Equal(t, []string{"withheld.example"}, msg.GetWithheldTrustDomains())
	assert.Empty(t, msg.GetPeerLimits(), "peer limits only when asked for")

	// The agent's own stream is its own trust, and names it.
	got, msg = recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{PeerLimits: true}))
	assert.Equal(t, nodeAgentID.String(), msg.GetSpiffeId())
	assert.ElementsMatch(t, []string{"denied.example", "example.org"}, got)
	assert.Equal(t, 3.0, testutil.ToFloat64(f.svc.WatchesOpenForTest()))
}

// An impersonated stream is refused as an impersonated certificate is.
func TestWatchBundlesImpersonationRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*certservice.Config)
		pods   func(*nodePods)
		cert   bool // the agent proves itself with an X509-SVID
		target string
		code   codes.Code
		msg    string
	}{
		{name: "not enabled", mutate: func(c *certservice.Config) { c.Impersonator = nil }, target: shopWeb.String(),
			code: codes.PermissionDenied, msg: "impersonation is not enabled"},
		{name: "caller proven by a certificate", cert: true, target: shopWeb.String(), code: codes.PermissionDenied, msg: "not a certificate"},
		{name: "target not on the node", target: "spiffe://example.org/ns/shop/sa/elsewhere", code: codes.PermissionDenied,
			msg: nodeAgentID.String() + " may not have the bundles of spiffe://example.org/ns/shop/sa/elsewhere"},
		{name: "not a SPIFFE ID", target: "web", code: codes.InvalidArgument, msg: `impersonated_identity "web" is not a SPIFFE ID`},
		{name: "a trust domain only", target: "spiffe://example.org", code: codes.InvalidArgument, msg: "not a SPIFFE ID of a workload"},
		{name: "node authorizer cannot decide", pods: func(p *nodePods) { p.set(shopWeb, true, fmt.Errorf("pods not listed yet: %w", authn.ErrUnavailable)) },
			target: shopWeb.String(), code: codes.Unavailable, msg: "retry later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newImpersonationFixture(t, tc.mutate)
			if tc.pods != nil {
				tc.pods(f.pods)
			}
			c := f.identityClient(t, nil, nodeAgentToken)
			if tc.cert {
				c = f.identityClient(t, svid(t, f.authority, nodeAgentID), "")
			}
			_, err := watchFor(t, c, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: tc.target}).Recv()
			assert.Equal(t, tc.code, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, tc.msg)
			assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.ImpersonatedWatchesForTest(tc.code.String())))
			assert.Contains(t, f.logs.String(), `"impersonated":"`+tc.target+`"`)
			assert.Equal(t, 0.0, testutil.ToFloat64(f.svc.WatchesOpenForTest()))
		})
	}
}

// A stream re-authorizes the impersonation with every re-authentication:
// once the workload's pod left the agent's node, the stream ends with
// PermissionDenied; when the node authorizer cannot decide, with
// Unavailable.
func TestWatchBundlesImpersonationReauthorized(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"pod left the node", nil, codes.PermissionDenied},
		{"authorizer cannot decide", fmt.Errorf("pods not listed yet: %w", authn.ErrUnavailable), codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			f := newImpersonationFixture(t, func(cfg *certservice.Config) {
				cfg.Clock = clk
				cfg.WatchReauthInterval = time.Minute
			})
			f.svc.SetRandForTest(func() float64 { return 0.5 }) // no jitter
			stream := watchFor(t, f.identityClient(t, nil, nodeAgentToken), &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String()})
			recvMsg(t, stream)
			require.Equal(t, 1, f.pods.asked())

			// One interval with the pod still there keeps the stream, and
			// asks again.
			require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
			clk.Step(time.Minute)
			require.Eventually(t, func() bool { return f.pods.asked() == 2 }, 10*time.Second, time.Millisecond, "re-authorized at the interval")
			require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)

			f.pods.set(shopWeb, false, tc.err)
			clk.Step(time.Minute)
			_, err := stream.Recv()
			assert.Equal(t, tc.code, status.Code(err), "%v", err)
			assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.ImpersonatedWatchesForTest(tc.code.String())))
			assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.WatchesForTest(tc.code.String(), authn.MethodKubernetesJWT)), "counted among all streams too")
			assert.Contains(t, f.logs.String(), `"msg":"bundle watch ended"`)
			assert.Contains(t, f.logs.String(), `"impersonated":"`+shopWeb.String()+`"`)
			assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.WatchMessagesForTest()), "nothing sent between")
		})
	}
}

// A policy change for the workload reaches the agent's stream for it.
func TestWatchBundlesImpersonatedPolicyChange(t *testing.T) {
	f := newImpersonationFixture(t, nil)
	stream := watchFor(t, f.identityClient(t, nil, nodeAgentToken), &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String(), PeerLimits: true})
	_, msg := recvMsg(t, stream)
	require.Len(t, msg.GetPeerLimits(), 1)

	f.policy.set(shopPolicy(t, "spiffe://withheld.example/web"))
	got, msg := recvMsg(t, stream)
	assert.Equal(t, shopWeb.String(), msg.GetSpiffeId())
	assert.ElementsMatch(t, []string{"allowed.example", "example.org", "withheld.example"}, got)
	assert.Equal(t, map[string][]string{"withheld.example": {"spiffe://withheld.example/web"}}, peerLimits(msg))
}

// An impersonated stream takes a slot of the workload, not of the agent:
// one agent service account serves every node, and would otherwise cap
// the cluster's impersonated streams at one identity's share.
func TestWatchBundlesImpersonatedSlotIsTheWorkloads(t *testing.T) {
	f := newImpersonationFixture(t, func(cfg *certservice.Config) { cfg.MaxBundleWatches, cfg.MaxBundleWatchesPerIdentity = 10, 1 })
	agent := f.identityClient(t, nil, nodeAgentToken)
	recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String()}))
	recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopAPI.String()}))
	recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{}))
	assert.Equal(t, 3.0, testutil.ToFloat64(f.svc.WatchesOpenForTest()), "one slot each of web, api and the agent")

	_, err := watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String()}).Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.ErrorContains(t, err, shopWeb.String()+" holds 1 bundle streams")
	_, err = watchFor(t, f.identityClient(t, svid(t, f.authority, shopWeb), ""), &identityapi.WatchBundlesRequest{}).Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "the workload's own stream shares its slots")
}

// An impersonated stream is charged to the agent's rate limit and to
// the agent's for the workload, as an impersonated signing is.
func TestWatchBundlesImpersonatedRateLimit(t *testing.T) {
	f := newImpersonationFixture(t, func(cfg *certservice.Config) { cfg.RateLimit, cfg.RateBurst = 1e-9, 2 })
	agent := f.identityClient(t, nil, nodeAgentToken)
	recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String()}))
	// The agent's own budget: one left. The agent for web: one left.
	recvMsg(t, watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopAPI.String()}))
	_, err := watchFor(t, agent, &identityapi.WatchBundlesRequest{ImpersonatedIdentity: shopWeb.String()}).Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "the agent's budget is spent")
	assert.ErrorContains(t, err, "rate limit")
	recvMsg(t, watchFor(t, f.identityClient(t, svid(t, f.authority, shopWeb), ""), &identityapi.WatchBundlesRequest{}))
}

// parseNames is the trust domains of msg's bundle map.
func parseNames(msg *identityapi.WatchBundlesResponse) ([]string, error) {
	bundles, _, err := bundledoc.ParseMap(msg.GetBundleMap())
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(bundles))
	for _, b := range bundles {
		out = append(out, b.TrustDomain().Name())
	}
	return out, nil
}
