package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
	"github.com/trustbridge/trustbridge/sds/attest"
)

var tdD = spiffeid.RequireTrustDomainFromString("d.test")

// federation is the server's federated trust, which the test changes.
type federation struct {
	mu      sync.Mutex
	bundles []*spiffebundle.Bundle
	changed chan struct{}
}

func (f *federation) Bundles() ([]*spiffebundle.Bundle, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bundles, f.changed
}

// replace puts b in place of the bundle of its trust domain.
func (f *federation) replace(b *spiffebundle.Bundle) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.DeleteFunc(slices.Clone(f.bundles), func(x *spiffebundle.Bundle) bool { return x.TrustDomain() == b.TrustDomain() })
	f.bundles = append(out, b)
	close(f.changed)
	f.changed = make(chan struct{})
}

// gatewayPeer is the one peer of c.test the shop may trust.
const gatewayPeer = "spiffe://c.test/ns/pay/sa/gateway"

// shopPolicy grants the shop namespace b.test whole and c.test for one
// peer, and the node agents' namespace d.test: the agent's own grant
// must never reach a workload.
func shopPolicy(t testing.TB, cPeers ...string) *trustpolicy.Policy {
	t.Helper()
	grants := []trustpolicy.TrustDomainGrant{{TrustDomain: tdB.Name()}}
	if len(cPeers) > 0 {
		grants = append(grants, trustpolicy.TrustDomainGrant{TrustDomain: tdC.Name(), Peers: cPeers})
	}
	p, err := trustpolicy.Compile(tdA, trustpolicy.DefaultDeny, []trustpolicy.Rule{
		{Name: "shop", Workloads: []trustpolicy.Selector{{Namespace: "shop"}}, TrustDomains: grants},
		{Name: "agents", Workloads: []trustpolicy.Selector{{Namespace: "kube-system"}}, TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: tdD.Name()}}},
	})
	require.NoError(t, err)
	return p
}

// nodeFixture is a node agent (Config.Node, the real attestor on a real
// socket, a real Rotator with the node's token) in front of the real
// certificate service, which holds a federation and a trust policy.
type nodeFixture struct {
	cs     *certService
	fed    *federation
	policy *trustpolicy.Cell
	ids    *identitymap.Cell
	b      *testca.CA
	socket string
	wl     string // the Workload API socket
	done   <-chan error
}

// startNodeFixture starts a node agent whose identity map gives this test
// process (a host process, by its uid) the identity id.
func startNodeFixture(t testing.TB, id spiffeid.ID, allow ...spiffeid.ID) *nodeFixture {
	t.Helper()
	return startNodeFixtureWith(t, nil, id, allow...)
}

// startNodeFixtureWith is startNodeFixture with the agent's Config
// changed by with (brokers, say) before it starts.
func startNodeFixtureWith(t testing.TB, with func(*Config), id spiffeid.ID, allow ...spiffeid.ID) *nodeFixture {
	t.Helper()
	return startNodeFixtureOn(t, nil, with, id, allow...)
}

// startNodeFixtureOn is startNodeFixtureWith with the certificate
// service's Config changed by csWith (a TaintSource, say) too.
func startNodeFixtureOn(t testing.TB, csWith func(*certservice.Config, *ca.Authority), with func(*Config), id spiffeid.ID, allow ...spiffeid.ID) *nodeFixture {
	t.Helper()
	return startNodeFixtureServing(t, nil, csWith, with, id, allow...)
}

// startNodeFixtureServing is startNodeFixtureOn whose certificate
// service's gRPC server has csOpts too (newCertServiceServing).
func startNodeFixtureServing(t testing.TB, csOpts []grpc.ServerOption, csWith func(*certservice.Config, *ca.Authority), with func(*Config), id spiffeid.ID, allow ...spiffeid.ID) *nodeFixture {
	t.Helper()
	f := &nodeFixture{fed: &federation{changed: make(chan struct{})}, policy: trustpolicy.NewCell(shopPolicy(t, gatewayPeer)),
		b: testca.New(t, tdB.Name())}
	c, d := testca.New(t, tdC.Name()), testca.New(t, tdD.Name())
	f.cs = newCertServiceServing(t, func(cfg *certservice.Config, authority *ca.Authority) {
		f.fed.bundles = []*spiffebundle.Bundle{authority.Bundle(), f.b.Bundle(), c.Bundle(), d.Bundle()}
		cfg.Bundles = f.fed
		cfg.Policy = trustpolicy.NewAccess(f.policy, nil)
		cfg.JWT = authority
		if csWith != nil {
			csWith(cfg, authority)
		}
	}, csOpts, allow...)

	dir := shortDir(t)
	token := filepath.Join(dir, "token")
	writeFile(t, token, []byte(nodeToken+"\n"))
	attestor, err := attest.New(attest.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	f.ids = identitymap.NewCell(hostMap(t, id))
	f.socket = filepath.Join(dir, "node.sock")
	f.wl = filepath.Join(dir, "api.sock")
	cfg := Config{
		SocketPath:        f.socket,
		WorkloadAPISocket: f.wl,
		CredentialsDir:    filepath.Join(dir, "creds"),
		Rotator: &RotatorConfig{CAAddr: f.cs.addr, Roots: f.cs.authority.Bundle().X509Authorities(), ServerID: serverID,
			TokenFile: token, GraceRatio: 0.5},
		Node:   &NodeConfig{Attestor: attestor, Map: f.ids, NodeName: "node-a"},
		RootCA: sds.RootCASPIFFE, // trustbridge agent --node's default
	}
	if with != nil {
		with(&cfg)
	}
	a := newTestAgent(t, cfg)
	_, f.done = runAgent(t, a)
	waitSocket(t, f.socket, f.done)
	return f
}

// hostMap gives this process, by its uid, the identity id.
func hostMap(t testing.TB, id spiffeid.ID) *identitymap.Map {
	t.Helper()
	uid := uint32(os.Getuid())
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: tdA, Default: identitymap.DefaultNone}, []identitymap.Rule{{
		Name: "this-test", Origin: "test", Workloads: []identitymap.Selector{{UID: &uid}}, SPIFFEID: id.String(),
	}})
	require.NoError(t, err)
	return m
}

// peerMatchers are the URI SAN matchers of an ALL secret, as text.
func peerMatchers(t *testing.T, s *tlsv3.Secret) []string {
	t.Helper()
	var out []string
	for _, m := range s.GetValidationContext().GetMatchTypedSubjectAltNames() {
		if p := m.GetMatcher().GetPrefix(); p != "" {
			out = append(out, p+"*")
		} else {
			out = append(out, m.GetMatcher().GetExact())
		}
	}
	slices.Sort(out)
	return out
}

// The node agent serves this process the identity attestation gives it,
// obtained as the node, and the trust the server decided for that
// workload: b.test whole, c.test for its one peer, never d.test (the
// agent's own grant); a federated root rotation and a policy change reach
// the open stream.
func TestNodeModeServesTheWorkloadItsOwnTrust(t *testing.T) {
	f := startNodeFixture(t, webID, webID)
	client := socketClient(t, f.socket)
	s, cancel := openStream(t, client, sds.DefaultName, sds.AllName)
	defer cancel()
	got := collect(t, s, hasAll(sds.DefaultName, sds.AllName), sds.DefaultName, sds.AllName)

	// What Istio's sidecar asks for, on a stream of its own.
	rs, cancelRoot := openStream(t, client, sds.RootCAName)
	defer cancelRoot()
	root := collect(t, rs, hasAll(sds.RootCAName), sds.RootCAName)[sds.RootCAName]
	assert.True(t, proto.Equal(got[sds.AllName].GetValidationContext(), root.GetValidationContext()),
		"ROOTCA is the workload's SPIFFE validator, as ALL")

	leaf := leafOf(t, got[sds.DefaultName])
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, webID.String(), leaf.URIs[0].String())
	assert.Equal(t, []string{"a.test", "b.test", "c.test"}, trustDomainsOf(t, got[sds.AllName]), "d.test is the agent's grant, not the workload's")
	assert.Equal(t, []string{"spiffe://a.test/*", "spiffe://b.test/*", gatewayPeer}, peerMatchers(t, got[sds.AllName]))
	assert.Contains(t, f.cs.imp.questions(), nodeID.String()+" -> "+webID.String())

	rotated := testca.New(t, tdB.Name())
	f.fed.replace(rotated.Bundle())
	rotatedIn := func(name string) func(map[string]*tlsv3.Secret) bool {
		return func(m map[string]*tlsv3.Secret) bool {
			byTD, err := parseSPIFFEValidator(m[name].GetValidationContext())
			require.NoError(t, err)
			return len(byTD[tdB]) == 1 && byTD[tdB][0].Equal(rotated.Bundle().X509Authorities()[0])
		}
	}
	collect(t, s, rotatedIn(sds.AllName), sds.DefaultName, sds.AllName)
	collect(t, rs, rotatedIn(sds.RootCAName), sds.RootCAName)

	f.policy.Set(shopPolicy(t))
	got = collect(t, s, func(m map[string]*tlsv3.Secret) bool {
		return !slices.Contains(trustDomainsOf(t, m[sds.AllName]), "c.test")
	}, sds.DefaultName, sds.AllName)
	assert.Equal(t, []string{"a.test", "b.test"}, trustDomainsOf(t, got[sds.AllName]))
	assert.Empty(t, peerMatchers(t, got[sds.AllName]), "no peer limit left: every member of every trust domain served")
}

// A workload the server does not let this node have (no pod of it on the
// node) is refused, with the server's reason; so is a process the
// identity map gives nothing. Neither gets any identity.
func TestNodeModeRefuses(t *testing.T) {
	f := startNodeFixture(t, apiID, webID)
	_, err := socketClient(t, f.socket).FetchSecrets(t.Context(), fetchRequest(sds.DefaultName))
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "no pod of this service account runs on the caller's node")

	m, err := identitymap.Compile(identitymap.Config{TrustDomain: tdA, Default: identitymap.DefaultNone}, nil)
	require.NoError(t, err)
	f.ids.Set(m)
	_, err = socketClient(t, f.socket).FetchSecrets(t.Context(), fetchRequest(sds.AllName))
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "no identity")
}

// An identity map change is attested anew on the stream's next
// re-authentication: the stream ends, and the caller's next one gets the
// identity it has now (never the old one).
func TestNodeModeIdentityFollowsTheMap(t *testing.T) {
	f := startNodeFixture(t, webID, webID, apiID)
	resp, err := socketClient(t, f.socket).FetchSecrets(t.Context(), fetchRequest(sds.DefaultName))
	require.NoError(t, err)
	assert.Equal(t, webID.String(), leafOf(t, secretsOf(t, resp)[sds.DefaultName]).URIs[0].String())
	f.ids.Set(hostMap(t, apiID))
	resp, err = socketClient(t, f.socket).FetchSecrets(t.Context(), fetchRequest(sds.DefaultName))
	require.NoError(t, err)
	assert.Equal(t, apiID.String(), leafOf(t, secretsOf(t, resp)[sds.DefaultName]).URIs[0].String())
}

// The socket is open to every local user: attestation is its access
// control.
func TestNodeModeSocketMode(t *testing.T) {
	f := startNodeFixture(t, webID, webID)
	fi, err := os.Stat(f.socket)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o666), fi.Mode().Perm())
}

// fetchRequest is a FetchSecrets request for names, as Envoy sends it.
func fetchRequest(names ...string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy"}, TypeUrl: resourcev3.SecretType, ResourceNames: names}
}

// The Workload API on a node agent serves each caller its own identity
// too, through go-spiffe's client: its SVID, the bundles the server lets
// that workload trust whole (c.test, granted for one peer only, cannot be
// a Workload API bundle; d.test is the agent's), JWT-SVIDs of its own
// identity only (minted by the server for the node acting for it), and
// the identity the map gives now on the next call.
func TestNodeModeWorkloadAPI(t *testing.T) {
	f := startNodeFixture(t, webID, webID, apiID)
	waitSocket(t, f.wl, f.done)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(f.wl)))
	require.NoError(t, err)
	defer c.Close()
	x, err := c.FetchX509Context(ctx)
	require.NoError(t, err)
	require.Len(t, x.SVIDs, 1)
	assert.Equal(t, webID, x.SVIDs[0].ID)
	var tds []string
	for _, b := range x.Bundles.Bundles() {
		tds = append(tds, b.TrustDomain().Name())
	}
	slices.Sort(tds)
	assert.Equal(t, []string{"a.test", "b.test"}, tds)

	jwt, err := c.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "db"})
	require.NoError(t, err)
	assert.Equal(t, webID, jwt.ID, "a JWT-SVID of the caller's own identity, minted as the node")
	jwtBundles, err := c.FetchJWTBundles(ctx)
	require.NoError(t, err)
	_, err = jwtsvid.ParseAndValidate(jwt.Marshal(), jwtBundles, []string{"db"})
	require.NoError(t, err, "valid against the bundles the Workload API hands out")
	assert.Contains(t, f.cs.imp.questions(), nodeID.String()+" -> "+webID.String())
	_, err = c.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "db", Subject: apiID})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "never another workload's")

	fi, err := os.Stat(f.wl)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o666), fi.Mode().Perm(), "attestation is the access control")

	f.ids.Set(hostMap(t, apiID))
	x, err = c.FetchX509Context(ctx)
	require.NoError(t, err)
	assert.Equal(t, apiID, x.SVIDs[0].ID)
	jwt, err = c.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "db"})
	require.NoError(t, err)
	assert.Equal(t, apiID, jwt.ID)
}

// The identity map's TTL for the caller's identity is what the agent asks
// the server for.
func TestNodeModeAsksForTheRulesTTL(t *testing.T) {
	f := startNodeFixture(t, webID, webID)
	uid := uint32(os.Getuid())
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: tdA, Default: identitymap.DefaultNone}, []identitymap.Rule{{
		Name: "this-test", Origin: "test", Workloads: []identitymap.Selector{{UID: &uid}}, SPIFFEID: webID.String(), TTL: 20 * time.Minute,
	}})
	require.NoError(t, err)
	f.ids.Set(m)
	resp, err := socketClient(t, f.socket).FetchSecrets(t.Context(), fetchRequest(sds.DefaultName))
	require.NoError(t, err)
	leaf := leafOf(t, secretsOf(t, resp)[sds.DefaultName])
	assert.InDelta(t, (20 * time.Minute).Seconds(), leaf.NotAfter.Sub(leaf.NotBefore).Seconds(), 60, "the rule's 20 minutes (the CA backdates a little)")
}
