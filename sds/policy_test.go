package sds

import (
	"crypto/x509"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// cellPolicy is the server's AccessPolicy (trustpolicy.Access) over a
// Cell, counting its decisions.
type cellPolicy struct {
	cell    *trustpolicy.Cell
	access  *trustpolicy.Access
	decides atomic.Int64
}

func newCellPolicy(p *trustpolicy.Policy) *cellPolicy {
	cell := trustpolicy.NewCell(p)
	return &cellPolicy{cell: cell, access: trustpolicy.NewAccess(cell, nil)}
}

func (c *cellPolicy) Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	c.decides.Add(1)
	return c.access.Decide(ident)
}

func mustCompile(t *testing.T, def trustpolicy.Default, rules ...trustpolicy.Rule) *trustpolicy.Policy {
	t.Helper()
	p, err := trustpolicy.Compile(localTD, def, rules)
	require.NoError(t, err)
	return p
}

// grantRule grants td (with peers) to the workloads matching selector.
func grantRule(name, selector, td string, peers ...string) trustpolicy.Rule {
	return trustpolicy.Rule{
		Name:         name,
		Origin:       "test",
		Workloads:    []trustpolicy.Selector{{SPIFFEID: selector}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: td, Peers: peers}},
	}
}

// matchers renders a validation context's SAN matchers as "exact:<v>" or
// "prefix:<v>", checking each is a URI SAN matcher.
func matchers(t *testing.T, vc *tlsv3.CertificateValidationContext) []string {
	t.Helper()
	var out []string
	for _, m := range vc.GetMatchTypedSubjectAltNames() {
		assert.Equal(t, tlsv3.SubjectAltNameMatcher_URI, m.GetSanType())
		switch {
		case m.GetMatcher().GetExact() != "":
			out = append(out, "exact:"+m.GetMatcher().GetExact())
		case m.GetMatcher().GetPrefix() != "":
			out = append(out, "prefix:"+m.GetMatcher().GetPrefix())
		default:
			t.Errorf("matcher %v is neither exact nor prefix", m)
		}
	}
	return out
}

func TestAllSecretPolicy(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	local, remote, other := newTestCA(t, localTD, clk), newTestCA(t, remoteTD, clk), newTestCA(t, otherTD, clk)
	bundles := []*x509bundle.Bundle{local.bundle(), other.bundle(), remote.bundle()}
	peer := "spiffe://remote.test/ns/billing/sa/api"
	restricted := mustCompile(t, trustpolicy.DefaultAllow, grantRule("a", idA.String(), "remote.test", peer, "spiffe://remote.test/ns/ops/*"))
	unrestricted := mustCompile(t, trustpolicy.DefaultDeny, grantRule("a", "spiffe://local.test/ns/a/*", "remote.test"))
	tests := []struct {
		name     string
		d        trustpolicy.Decision
		plain    bool
		tds      []string
		roots    []*x509.Certificate // plain only
		matchers []string
	}{
		{name: "no policy", tds: []string{"local.test", "other.test", "remote.test"}},
		{name: "no policy plain", plain: true, roots: []*x509.Certificate{local.cert, other.cert, remote.cert}},
		{name: "restricted grant lists every trust domain", d: restricted.Decide(trustpolicy.Subject{ID: idA}),
			tds: []string{"local.test", "other.test", "remote.test"},
			matchers: []string{"prefix:spiffe://local.test/", "prefix:spiffe://other.test/",
				"exact:" + peer, "prefix:spiffe://remote.test/ns/ops/"}},
		{name: "restricted grant plain", d: restricted.Decide(trustpolicy.Subject{ID: idA}), plain: true,
			roots: []*x509.Certificate{local.cert, other.cert, remote.cert},
			matchers: []string{"prefix:spiffe://local.test/", "prefix:spiffe://other.test/",
				"exact:" + peer, "prefix:spiffe://remote.test/ns/ops/"}},
		{name: "governed and not granted", d: restricted.Decide(trustpolicy.Subject{ID: idB}),
			tds: []string{"local.test", "other.test"}},
		{name: "governed and not granted plain", d: restricted.Decide(trustpolicy.Subject{ID: idB}), plain: true,
			roots: []*x509.Certificate{local.cert, other.cert}},
		{name: "default deny, unrestricted grant", d: unrestricted.Decide(trustpolicy.Subject{ID: idA}),
			tds: []string{"local.test", "remote.test"}},
		{name: "default deny, nothing granted", d: unrestricted.Decide(trustpolicy.Subject{ID: idB}),
			tds: []string{"local.test"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := allSecret(bundles, tt.plain, tt.d)
			require.NoError(t, err)
			require.NotNil(t, s)
			assert.Equal(t, AllName, s.GetName())
			if tt.plain {
				assert.Equal(t, tt.roots, rootsOf(t, s))
			} else {
				assert.Equal(t, tt.tds, sortedKeys(spiffeConfig(t, s)))
			}
			assert.Equal(t, tt.matchers, matchers(t, s.GetValidationContext()))
		})
	}
	t.Run("nothing allowed has roots", func(t *testing.T) {
		s, err := allSecret([]*x509bundle.Bundle{remote.bundle()}, false, unrestricted.Decide(trustpolicy.Subject{ID: idB}))
		require.NoError(t, err)
		assert.Nil(t, s, "Envoy refuses a SPIFFE validator without trust domains")
	})
}

func TestTrustDomainSecretPolicy(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	local, remote := newTestCA(t, localTD, clk), newTestCA(t, remoteTD, clk)
	trust := &Trust{Bundles: []*x509bundle.Bundle{local.bundle(), remote.bundle()}}
	idC := spiffeid.RequireFromPath(localTD, "/ns/c/sa/c")
	pol := mustCompile(t, trustpolicy.DefaultAllow,
		grantRule("a", idA.String(), "remote.test", "spiffe://remote.test/ns/billing/*"),
		grantRule("c", "spiffe://local.test/ns/c/*", "remote.test"))
	c := newValidationCache(localTD, clk.Now, func() {})
	tests := []struct {
		name     string
		resource string
		sub      spiffeid.ID
		roots    []*x509.Certificate // nil: denied or absent
		denied   bool
		matchers []string
	}{
		{name: "local by ROOTCA", resource: "ROOTCA", sub: idB, roots: []*x509.Certificate{local.cert}},
		{name: "local by name", resource: "spiffe://local.test", sub: idB, roots: []*x509.Certificate{local.cert}},
		{name: "restricted grant", resource: "spiffe://remote.test", sub: idA, roots: []*x509.Certificate{remote.cert},
			matchers: []string{"prefix:spiffe://remote.test/ns/billing/"}},
		{name: "unrestricted grant", resource: "spiffe://remote.test", sub: idC, roots: []*x509.Certificate{remote.cert}},
		{name: "governed, not granted", resource: "spiffe://remote.test", sub: idB, denied: true,
			matchers: []string{"exact:" + DeniedSAN}},
		{name: "unknown trust domain", resource: "spiffe://other.test", sub: idB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := pol.Decide(trustpolicy.Subject{ID: tt.sub})
			e, err := c.get(trust, tt.resource, parseName(tt.resource, localTD), false, d)
			require.NoError(t, err)
			if tt.roots == nil && !tt.denied {
				assert.Nil(t, e)
				return
			}
			require.NotNil(t, e)
			assert.Equal(t, tt.denied, e.denied)
			s := secrets(t, []*anypb.Any{e.any})[tt.resource]
			require.NotNil(t, s)
			got := rootsOf(t, s)
			if tt.denied {
				require.Len(t, got, 1)
				assert.Equal(t, "trustbridge trust policy: remote.test denied", got[0].Subject.CommonName)
				assert.True(t, got[0].IsCA)
				assert.NotContains(t, got, remote.cert, "never another domain's roots")
				assert.NotContains(t, got, local.cert)
			} else {
				assert.Equal(t, tt.roots, got)
			}
			assert.Equal(t, tt.matchers, matchers(t, s.GetValidationContext()))
		})
	}
	t.Run("a denial keeps its version across Trust changes", func(t *testing.T) {
		d := pol.Decide(trustpolicy.Subject{ID: idB})
		name := "spiffe://remote.test"
		e1, err := c.get(trust, name, parseName(name, localTD), false, d)
		require.NoError(t, err)
		rotated := newTestCA(t, remoteTD, clk)
		next := &Trust{Bundles: []*x509bundle.Bundle{local.bundle(), rotated.bundle()}}
		e2, err := c.get(next, name, parseName(name, localTD), false, d)
		require.NoError(t, err)
		assert.Equal(t, e1.version, e2.version)
		// Once the trust domain is gone from the current and previous
		// Trust, its sentinel goes too.
		_, err = c.get(&Trust{Bundles: []*x509bundle.Bundle{local.bundle()}}, "ROOTCA", parseName("ROOTCA", localTD), false, d)
		require.NoError(t, err)
		_, err = c.get(&Trust{Bundles: []*x509bundle.Bundle{local.bundle()}}, "ROOTCA", parseName("ROOTCA", localTD), false, d)
		require.NoError(t, err)
		assert.Empty(t, c.denials)
	})
	t.Run("denied without roots", func(t *testing.T) {
		// A governed trust domain the server holds no roots of, or no
		// bundle of at all, is still denied explicitly: silence would
		// leave Envoy the roots it had. An ungoverned unknown one is not
		// answered (default deny here), so made-up names mint nothing.
		deny := mustCompile(t, trustpolicy.DefaultDeny, grantRule("c", "spiffe://local.test/ns/c/*", "gone.test"))
		d := deny.Decide(trustpolicy.Subject{ID: idB})
		empty := &Trust{Bundles: []*x509bundle.Bundle{local.bundle(), x509bundle.New(remoteTD)}}
		c := newValidationCache(localTD, clk.Now, func() {})
		for _, name := range []string{"spiffe://remote.test", "spiffe://gone.test"} {
			e, err := c.get(empty, name, parseName(name, localTD), false, d)
			require.NoError(t, err)
			require.NotNil(t, e, name)
			assert.True(t, e.denied, name)
		}
		e, err := c.get(empty, "spiffe://made-up.test", parseName("spiffe://made-up.test", localTD), false, d)
		require.NoError(t, err)
		assert.Nil(t, e)
	})
}

// The encodings of a decision live while a stream holds it: callers with
// ever new decisions do not grow the cache.
func TestValidationCacheBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	local, remote := newTestCA(t, localTD, clk), newTestCA(t, remoteTD, clk)
	trust := &Trust{Bundles: []*x509bundle.Bundle{local.bundle(), remote.bundle()}}
	encodings := 0
	c := newValidationCache(localTD, clk.Now, func() { encodings++ })
	all := parseName(AllName, localTD)
	for i := range 50 {
		pol := mustCompile(t, trustpolicy.DefaultAllow,
			grantRule("a", idA.String(), "remote.test", "spiffe://remote.test/ns/n"+strconv.Itoa(i)+"/*"))
		d := pol.Decide(trustpolicy.Subject{ID: idA})
		// Not held by a stream (a Fetch): encoded, not kept.
		e1, err := c.get(trust, AllName, all, false, d)
		require.NoError(t, err)
		c.acquire(d.Key())
		e2, err := c.get(trust, AllName, all, false, d)
		require.NoError(t, err)
		e3, err := c.get(trust, AllName, all, false, d)
		require.NoError(t, err)
		assert.Equal(t, e1.version, e2.version)
		assert.Same(t, e2, e3, "shared while held")
		c.acquire(d.Key())
		c.release(d.Key())
		assert.Contains(t, c.cur.entries, d.Key(), "still held by one stream")
		c.release(d.Key())
		assert.NotContains(t, c.cur.entries, d.Key())
	}
	assert.Equal(t, 100, encodings)
	assert.Empty(t, c.live)
	assert.Empty(t, c.cur.entries)
}

const billingPeer = "spiffe://remote.test/ns/billing/sa/api"

// newPolicyEnv is a server whose policy grants remote.test to idA, peer
// billingPeer only; idB is not granted it, so it is denied.
func newPolicyEnv(t *testing.T) (*env, *cellPolicy) {
	t.Helper()
	pol := newCellPolicy(mustCompile(t, trustpolicy.DefaultAllow,
		grantRule("payments", idA.String(), "remote.test", billingPeer)))
	return newEnv(t, func(c *Config) { c.Policy = pol }), pol
}

// assertDenied checks the explicit denial of td: one sentinel CA and a
// SAN no certificate has.
func assertDenied(t *testing.T, s *tlsv3.Secret, td string) {
	t.Helper()
	require.NotNil(t, s, "no answer for the denied trust domain")
	roots := rootsOf(t, s)
	require.Len(t, roots, 1)
	assert.Equal(t, DeniedSubjectPrefix+td+" denied", roots[0].Subject.CommonName)
	assert.Equal(t, []string{"exact:" + DeniedSAN}, matchers(t, s.GetValidationContext()))
}

// allRoots is every certificate a validation context trusts, in
// trusted_ca or in the SPIFFE validator's trust domains.
func allRoots(t *testing.T, s *tlsv3.Secret) []*x509.Certificate {
	t.Helper()
	vc := s.GetValidationContext()
	out := certsFromPEM(t, vc.GetTrustedCa().GetInlineBytes())
	if cv := vc.GetCustomValidatorConfig(); cv != nil {
		for _, roots := range spiffeConfig(t, s) {
			out = append(out, roots...)
		}
	}
	return out
}

// neverSees checks that no secret trusts any of certs.
func neverSees(t *testing.T, secs map[string]*tlsv3.Secret, certs ...*x509.Certificate) {
	t.Helper()
	for name, s := range secs {
		for _, c := range certs {
			assert.NotContains(t, allRoots(t, s), c, "%s holds a root of a denied trust domain", name)
		}
	}
}

// Two workloads of one server get different ALL contents; the denied one
// never sees the partner's roots, after a policy edit (pushed to the
// affected stream only) and after a federated rotation either.
func TestPolicyStreamSecrets(t *testing.T) {
	e, pol := newPolicyEnv(t)
	names := []string{AllName, "spiffe://remote.test"}
	a, b := e.stream("token-a"), e.stream("token-b")
	require.NoError(t, a.Send(sotwReq(names...)))
	require.NoError(t, b.Send(sotwReq(names...)))
	ra1, rb1 := recv(t, a), recv(t, b)

	secA := secretsOf(t, ra1)
	assert.Equal(t, map[string][]*x509.Certificate{"local.test": {e.ca.cert}, "remote.test": {e.remote.cert}}, spiffeConfig(t, secA[AllName]))
	assert.Equal(t, []string{"prefix:spiffe://local.test/", "exact:" + billingPeer}, matchers(t, secA[AllName].GetValidationContext()))
	assert.Equal(t, []*x509.Certificate{e.remote.cert}, rootsOf(t, secA["spiffe://remote.test"]))
	assert.Equal(t, []string{"exact:" + billingPeer}, matchers(t, secA["spiffe://remote.test"].GetValidationContext()))

	secB := secretsOf(t, rb1)
	assert.Equal(t, map[string][]*x509.Certificate{"local.test": {e.ca.cert}}, spiffeConfig(t, secB[AllName]))
	assert.Empty(t, matchers(t, secB[AllName].GetValidationContext()))
	assertDenied(t, secB["spiffe://remote.test"], "remote.test")
	neverSees(t, secB, e.remote.cert)
	assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.policyDenials.WithLabelValues("remote.test")))
	require.NoError(t, a.Send(ack(ra1, names...)))
	require.NoError(t, b.Send(ack(rb1, names...)))
	e.waitHandled(4)

	// A policy edit that changes only A's peers reaches A at once.
	pol.cell.Set(mustCompile(t, trustpolicy.DefaultAllow, grantRule("payments", idA.String(), "remote.test", "spiffe://remote.test/ns/billing/*")))
	ra2 := recv(t, a)
	assert.Equal(t, "2", ra2.GetNonce())
	secA = secretsOf(t, ra2)
	assert.Equal(t, []string{"prefix:spiffe://local.test/", "prefix:spiffe://remote.test/ns/billing/"}, matchers(t, secA[AllName].GetValidationContext()))
	require.NoError(t, a.Send(ack(ra2, names...)))
	e.waitHandled(1)

	// A federated rotation: A gets the new partner roots.
	rotated := newTestCA(t, remoteTD, e.clock)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), rotated.bundle()}))
	ra3 := recv(t, a)
	assert.Equal(t, "3", ra3.GetNonce())
	secA = secretsOf(t, ra3)
	assert.Equal(t, []*x509.Certificate{rotated.cert}, rootsOf(t, secA["spiffe://remote.test"]))
	require.NoError(t, a.Send(ack(ra3, names...)))
	e.waitHandled(1)

	// A local change reaches B as its second response: neither the
	// policy edit nor the rotation sent it anything, and it still trusts
	// no partner root.
	extra := newTestCA(t, localTD, e.clock)
	localBundle := e.ca.bundle()
	localBundle.AddX509Authority(extra.cert)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{localBundle, rotated.bundle()}))
	rb2 := recv(t, b)
	assert.Equal(t, "2", rb2.GetNonce())
	secB2 := secretsOf(t, rb2)
	assert.Equal(t, map[string][]*x509.Certificate{"local.test": {e.ca.cert, extra.cert}}, spiffeConfig(t, secB2[AllName]))
	assertDenied(t, secB2["spiffe://remote.test"], "remote.test")
	assert.Equal(t, rootsOf(t, secB["spiffe://remote.test"]), rootsOf(t, secB2["spiffe://remote.test"]), "the denial is stable")
	neverSees(t, secB2, e.remote.cert, rotated.cert)
	assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.policyDenials.WithLabelValues("remote.test")), "counted once per stream and decision")
}

func deltaSecrets(t *testing.T, resp *discoveryv3.DeltaDiscoveryResponse) map[string]*tlsv3.Secret {
	t.Helper()
	anys := make([]*anypb.Any, 0, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		anys = append(anys, r.GetResource())
	}
	return secrets(t, anys)
}

// The same on delta streams; a trust domain the policy takes away is
// answered with the denial as a resource, not removed.
func TestPolicyDeltaSecrets(t *testing.T) {
	e, pol := newPolicyEnv(t)
	names := []string{AllName, "spiffe://remote.test"}
	a, b := e.delta("token-a"), e.delta("token-b")
	for _, s := range []deltaClient{a, b} {
		require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(nil), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: names}))
	}
	ra1, rb1 := recvDelta(t, a), recvDelta(t, b)
	secA := deltaSecrets(t, ra1)
	assert.Equal(t, []string{"local.test", "remote.test"}, sortedKeys(spiffeConfig(t, secA[AllName])))
	secB := deltaSecrets(t, rb1)
	assert.Equal(t, []string{"local.test"}, sortedKeys(spiffeConfig(t, secB[AllName])))
	assertDenied(t, secB["spiffe://remote.test"], "remote.test")
	neverSees(t, secB, e.remote.cert)
	require.NoError(t, a.Send(deltaAck(ra1)))
	require.NoError(t, b.Send(deltaAck(rb1)))
	e.waitHandled(4)

	// A loses remote.test.
	pol.cell.Set(mustCompile(t, trustpolicy.DefaultAllow, grantRule("elsewhere", "spiffe://local.test/ns/x/*", "remote.test")))
	ra2 := recvDelta(t, a)
	assert.Equal(t, "2", ra2.GetNonce())
	assert.Empty(t, ra2.GetRemovedResources())
	secA = deltaSecrets(t, ra2)
	assert.Equal(t, []string{AllName, "spiffe://remote.test"}, sortedKeys(secA))
	assert.Equal(t, []string{"local.test"}, sortedKeys(spiffeConfig(t, secA[AllName])))
	assertDenied(t, secA["spiffe://remote.test"], "remote.test")
	assert.Equal(t, deltaNames(t, rb1)["spiffe://remote.test"], deltaNames(t, ra2)["spiffe://remote.test"], "one denial shared")
	require.NoError(t, a.Send(deltaAck(ra2)))
	e.waitHandled(1)

	// A federated rotation changes nothing either trusts; a local change
	// is the next response of both.
	rotated := newTestCA(t, remoteTD, e.clock)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), rotated.bundle()}))
	extra := newTestCA(t, localTD, e.clock)
	localBundle := e.ca.bundle()
	localBundle.AddX509Authority(extra.cert)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{localBundle, rotated.bundle()}))
	for _, tc := range []struct {
		s     deltaClient
		nonce string
	}{{a, "3"}, {b, "2"}} {
		r := recvDelta(t, tc.s)
		assert.Equal(t, tc.nonce, r.GetNonce())
		sec := deltaSecrets(t, r)
		assert.Equal(t, []string{AllName}, sortedKeys(sec), "the denial is unchanged")
		assert.Equal(t, map[string][]*x509.Certificate{"local.test": {e.ca.cert, extra.cert}}, spiffeConfig(t, sec[AllName]))
		neverSees(t, sec, e.remote.cert, rotated.cert)
	}
}

// A stream decides again after re-authenticating, even when the policy
// gives no channel.
func TestPolicyReauthenticationDecides(t *testing.T) {
	var cur atomic.Pointer[trustpolicy.Policy]
	cur.Store(mustCompile(t, trustpolicy.DefaultDeny))
	decide := AccessPolicyFunc(func(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
		return cur.Load().Decide(trustpolicy.Subject{ID: ident.ID}), nil
	})
	e := newEnv(t, func(c *Config) { c.Policy = decide })
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq(AllName)))
	r1 := recv(t, s)
	assert.Equal(t, []string{"local.test"}, sortedKeys(spiffeConfig(t, secretsOf(t, r1)[AllName])))
	require.NoError(t, s.Send(ack(r1, AllName)))
	e.waitHandled(2)

	cur.Store(mustCompile(t, trustpolicy.DefaultDeny, grantRule("a", idA.String(), "remote.test")))
	e.clock.Step(DefaultReauthInterval)
	r2 := recv(t, s)
	assert.Equal(t, []string{"local.test", "remote.test"}, sortedKeys(spiffeConfig(t, secretsOf(t, r2)[AllName])))
}

// A stream that re-authenticated (deciding again, and getting the same
// open channel back) still hears the next policy change at once: the
// same channel is not taken for a spent one while it is open.
func TestPolicyChangeAfterReauthentication(t *testing.T) {
	for _, kind := range []string{"sotw", "delta"} {
		t.Run(kind, func(t *testing.T) {
			e, pol := newPolicyEnv(t)
			names := []string{AllName}
			var first func() map[string]*tlsv3.Secret
			var next func() map[string]*tlsv3.Secret
			if kind == "sotw" {
				a := e.stream("token-a")
				require.NoError(t, a.Send(sotwReq(names...)))
				// (the SotW request carries its node)
				r := recv(t, a)
				require.NoError(t, a.Send(ack(r, names...)))
				first = func() map[string]*tlsv3.Secret { return secretsOf(t, r) }
				next = func() map[string]*tlsv3.Secret { return secretsOf(t, recv(t, a)) }
			} else {
				a := e.delta("token-a")
				require.NoError(t, a.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(nil), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: names}))
				r := recvDelta(t, a)
				require.NoError(t, a.Send(deltaAck(r)))
				first = func() map[string]*tlsv3.Secret { return deltaSecrets(t, r) }
				next = func() map[string]*tlsv3.Secret { return deltaSecrets(t, recvDelta(t, a)) }
			}
			assert.Contains(t, spiffeConfig(t, first()[AllName]), "remote.test")
			e.waitHandled(2)
			before := pol.decides.Load()
			e.clock.Step(DefaultReauthInterval)
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				assert.Greater(c, pol.decides.Load(), before, "the stream re-authenticated and decided again")
			}, 10*time.Second, 5*time.Millisecond)

			pol.cell.Set(mustCompile(t, trustpolicy.DefaultAllow, grantRule("payments", idB.String(), "remote.test")))
			assert.NotContains(t, spiffeConfig(t, next()[AllName]), "remote.test", "the revocation reached the stream")
		})
	}
}

// A policy that hands back the channel that fired does not make streams
// spin: the stream stops waiting on it.
func TestPolicySpentChannel(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	var calls atomic.Int64
	decide := AccessPolicyFunc(func(authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
		calls.Add(1)
		return trustpolicy.Decision{}, closed
	})
	e := newEnv(t, func(c *Config) { c.Policy = decide })
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq(AllName)))
	r1 := recv(t, s)
	require.NoError(t, s.Send(ack(r1, AllName)))
	e.waitHandled(2)
	n := calls.Load()
	require.NoError(t, s.Send(ack(r1, AllName)))
	e.waitHandled(1)
	assert.LessOrEqual(t, calls.Load(), n+1)
}
