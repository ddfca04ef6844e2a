package sds

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

func TestParseRootCAMode(t *testing.T) {
	tests := []struct {
		in      string
		want    RootCAMode
		wantErr bool
	}{
		{"local", RootCALocal, false},
		{"spiffe", RootCASPIFFE, false},
		{"", "", true},
		{"SPIFFE", "", true},
		{"all", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRootCAMode(tt.in)
			if !tt.wantErr {
				require.NoError(t, err)
				assert.Equal(t, tt.want, got)
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, `"local"`, "the error names the valid values")
			assert.ErrorContains(t, err, `"spiffe"`, "the error names the valid values")
		})
	}
}

func TestNewRootCAMode(t *testing.T) {
	base := Config{TrustDomain: localTD, Trust: NewTrustCell(), Authenticator: &tokens{}}
	for _, m := range []RootCAMode{"", RootCALocal, RootCASPIFFE} {
		cfg := base
		cfg.RootCA = m
		s, err := New(cfg)
		require.NoError(t, err, "mode %q", m)
		if m == "" {
			assert.Equal(t, RootCALocal, s.cfg.RootCA, "the zero value is local")
		}
	}
	cfg := base
	cfg.RootCA = "all"
	_, err := New(cfg)
	assert.ErrorContains(t, err, `unknown ROOTCA mode "all"`)
}

func withRootCA(m RootCAMode) envOption { return func(c *Config) { c.RootCA = m } }

// newRootCAPolicyEnv is newPolicyEnv in mode m, with other.test trusted
// too: idA is granted remote.test for billingPeer only and other.test
// unlimited; idB is denied remote.test.
func newRootCAPolicyEnv(t *testing.T, m RootCAMode) (*env, *cellPolicy, *testCA) {
	t.Helper()
	pol := newCellPolicy(mustCompile(t, trustpolicy.DefaultAllow,
		grantRule("payments", idA.String(), "remote.test", billingPeer)))
	e := newEnv(t, func(c *Config) { c.Policy = pol }, withRootCA(m))
	other := newTestCA(t, otherTD, e.clock)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), e.remote.bundle(), other.bundle()}))
	return e, pol, other
}

// sameAsAll checks that ROOTCA is ALL's validation context, field for
// field, under its own name.
func sameAsAll(t *testing.T, sec map[string]*tlsv3.Secret) {
	t.Helper()
	require.Contains(t, sec, RootCAName)
	require.Contains(t, sec, AllName)
	assert.True(t, proto.Equal(sec[AllName].GetValidationContext(), sec[RootCAName].GetValidationContext()),
		"ROOTCA %v\nALL %v", sec[RootCAName].GetValidationContext(), sec[AllName].GetValidationContext())
}

// In spiffe mode ROOTCA is the caller's ALL: the SPIFFE validator with
// the trust domains its decision allows and its peer limits, while
// spiffe://<local td> stays the local roots alone.
func TestRootCASPIFFEIsAll(t *testing.T) {
	e, _, other := newRootCAPolicyEnv(t, RootCASPIFFE)
	names := []string{AllName, RootCAName, "spiffe://local.test"}
	a, b := e.stream("token-a"), e.stream("token-b")
	require.NoError(t, a.Send(sotwReq(names...)))
	require.NoError(t, b.Send(sotwReq(names...)))
	secA, secB := secretsOf(t, recv(t, a)), secretsOf(t, recv(t, b))

	sameAsAll(t, secA)
	assert.Equal(t, map[string][]*x509.Certificate{
		"local.test": {e.ca.cert}, "other.test": {other.cert}, "remote.test": {e.remote.cert},
	}, spiffeConfig(t, secA[RootCAName]))
	assert.Equal(t, []string{"prefix:spiffe://local.test/", "prefix:spiffe://other.test/", "exact:" + billingPeer},
		matchers(t, secA[RootCAName].GetValidationContext()), "the peer limit, and every member of the others")
	assert.Equal(t, []*x509.Certificate{e.ca.cert}, rootsOf(t, secA["spiffe://local.test"]))

	sameAsAll(t, secB)
	assert.Equal(t, map[string][]*x509.Certificate{"local.test": {e.ca.cert}, "other.test": {other.cert}},
		spiffeConfig(t, secB[RootCAName]), "the denied trust domain is absent")
	assert.Empty(t, matchers(t, secB[RootCAName].GetValidationContext()))
	neverSees(t, secB, e.remote.cert)
	assert.Equal(t, []*x509.Certificate{e.ca.cert}, rootsOf(t, secB["spiffe://local.test"]))
}

// A node that sets disable_spiffe_cert_validation gets ROOTCA as ALL's
// one trusted_ca, with the same peer limits.
func TestRootCASPIFFEDisableSPIFFEValidation(t *testing.T) {
	e, _, other := newRootCAPolicyEnv(t, RootCASPIFFE)
	for _, tc := range []struct {
		tok   string
		roots []*x509.Certificate
		sans  []string
	}{
		{"token-a", []*x509.Certificate{e.ca.cert, other.cert, e.remote.cert},
			[]string{"prefix:spiffe://local.test/", "prefix:spiffe://other.test/", "exact:" + billingPeer}},
		{"token-b", []*x509.Certificate{e.ca.cert, other.cert}, nil},
	} {
		t.Run(tc.tok, func(t *testing.T) {
			s := e.stream(tc.tok)
			req := sotwReq(AllName, RootCAName)
			req.Node = node(map[string]any{DisableSPIFFEValidationKey: true})
			require.NoError(t, s.Send(req))
			sec := secretsOf(t, recv(t, s))
			sameAsAll(t, sec)
			assert.Equal(t, tc.roots, rootsOf(t, sec[RootCAName]))
			assert.Equal(t, tc.sans, matchers(t, sec[RootCAName].GetValidationContext()))
		})
	}
}

// The local mode, named or zero, keeps ROOTCA the local roots.
func TestRootCALocal(t *testing.T) {
	for _, m := range []RootCAMode{"", RootCALocal} {
		t.Run(string(m), func(t *testing.T) {
			e, _, _ := newRootCAPolicyEnv(t, m)
			s := e.stream("token-a")
			require.NoError(t, s.Send(sotwReq(AllName, RootCAName)))
			sec := secretsOf(t, recv(t, s))
			assert.Equal(t, []*x509.Certificate{e.ca.cert}, rootsOf(t, sec[RootCAName]))
			assert.Empty(t, matchers(t, sec[RootCAName].GetValidationContext()))
			assert.Len(t, spiffeConfig(t, sec[AllName]), 3)
		})
	}
}

// FetchSecrets answers ROOTCA as ALL too.
func TestRootCASPIFFEFetch(t *testing.T) {
	e, _, _ := newRootCAPolicyEnv(t, RootCASPIFFE)
	resp, err := e.client().FetchSecrets(withToken(context.Background(), "token-b"), sotwReq(AllName, RootCAName))
	require.NoError(t, err)
	sec := secretsOf(t, resp)
	sameAsAll(t, sec)
	neverSees(t, sec, e.remote.cert)
}

// One cache holding ROOTCA as ALL and as the local roots, under the same
// decision, keeps the two apart.
func TestValidationCacheRootCAModesApart(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	local, remote := newTestCA(t, localTD, clk), newTestCA(t, remoteTD, clk)
	trust := &Trust{Bundles: []*x509bundle.Bundle{local.bundle(), remote.bundle()}}
	c := newValidationCache(localTD, clk.Now, func() {})
	var d trustpolicy.Decision
	asLocal, err := c.get(trust, RootCAName, parseName(RootCAName, localTD), false, d)
	require.NoError(t, err)
	asAll, err := c.get(trust, RootCAName, parsedName{kind: kindAll}, false, d)
	require.NoError(t, err)
	again, err := c.get(trust, RootCAName, parseName(RootCAName, localTD), false, d)
	require.NoError(t, err)
	assert.Same(t, asLocal, again)
	assert.NotEqual(t, asLocal.version, asAll.version)
	assert.Equal(t, []*x509.Certificate{local.cert}, rootsOf(t, secrets(t, []*anypb.Any{asLocal.any})[RootCAName]))
	assert.Equal(t, []string{"local.test", "remote.test"}, sortedKeys(spiffeConfig(t, secrets(t, []*anypb.Any{asAll.any})[RootCAName])))
}

// A trust change and a policy change push a new ROOTCA on open SotW and
// delta streams, as they push ALL.
func TestRootCASPIFFEPushed(t *testing.T) {
	for _, kind := range []string{"sotw", "delta"} {
		t.Run(kind, func(t *testing.T) {
			e, pol, other := newRootCAPolicyEnv(t, RootCASPIFFE)
			var next func() map[string]*tlsv3.Secret
			if kind == "sotw" {
				s := e.stream("token-a")
				require.NoError(t, s.Send(sotwReq(RootCAName)))
				first := recv(t, s)
				require.NoError(t, s.Send(ack(first, RootCAName)))
				assert.Contains(t, spiffeConfig(t, secretsOf(t, first)[RootCAName]), "remote.test")
				next = func() map[string]*tlsv3.Secret {
					r := recv(t, s)
					require.NoError(t, s.Send(ack(r, RootCAName)))
					return secretsOf(t, r)
				}
			} else {
				s := e.delta("token-a")
				require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(nil), TypeUrl: resourcev3.SecretType,
					ResourceNamesSubscribe: []string{RootCAName}}))
				first := recvDelta(t, s)
				require.NoError(t, s.Send(deltaAck(first)))
				assert.Contains(t, spiffeConfig(t, deltaSecrets(t, first)[RootCAName]), "remote.test")
				next = func() map[string]*tlsv3.Secret {
					r := recvDelta(t, s)
					require.NoError(t, s.Send(deltaAck(r)))
					return deltaSecrets(t, r)
				}
			}
			e.waitHandled(2)

			// A federated rotation.
			rotated := newTestCA(t, remoteTD, e.clock)
			require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), rotated.bundle(), other.bundle()}))
			sec := next()
			assert.Equal(t, []*x509.Certificate{rotated.cert}, spiffeConfig(t, sec[RootCAName])["remote.test"])
			e.waitHandled(1)

			// A policy edit widening A's peers.
			pol.cell.Set(mustCompile(t, trustpolicy.DefaultAllow, grantRule("payments", idA.String(), "remote.test", "spiffe://remote.test/ns/billing/*")))
			sec = next()
			assert.Equal(t, []string{"prefix:spiffe://local.test/", "prefix:spiffe://other.test/", "prefix:spiffe://remote.test/ns/billing/"},
				matchers(t, sec[RootCAName].GetValidationContext()))
			e.waitHandled(1)

			// A policy edit taking remote.test away.
			pol.cell.Set(mustCompile(t, trustpolicy.DefaultAllow, grantRule("elsewhere", "spiffe://local.test/ns/x/*", "remote.test")))
			sec = next()
			assert.Equal(t, []string{"local.test", "other.test"}, sortedKeys(spiffeConfig(t, sec[RootCAName])))
			neverSees(t, sec, e.remote.cert, rotated.cert)
		})
	}
}
