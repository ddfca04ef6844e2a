package statusui

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// The page shows each OIDC issuer with its discovery document, trust
// domain, the keys its JWKS serves (kid, alg, use), who serves it and
// whether the certificate covers its host, before the authorities.
func TestPageOIDCIssuers(t *testing.T) {
	ours := api.OIDCIssuer{
		URL: "https://oidc.prod.acme.example", TrustDomain: "prod.acme.example", Local: true, ServedHere: true,
		DiscoveryURL: "https://oidc.prod.acme.example/.well-known/openid-configuration", JWKSURL: "https://oidc.prod.acme.example/keys",
		Keys:        []api.OIDCIssuerKey{{KID: "k-active", Algorithm: "ES256", Use: "sig"}, {KID: "k-legacy", Algorithm: "RS256"}},
		Algorithms:  []string{"ES256", "RS256"},
		Certificate: &api.OIDCIssuerCertificate{Names: []string{"oidc.prod.acme.example", "bundle.prod.acme.example"}, CoversHost: true},
	}
	relayed := api.OIDCIssuer{
		URL: "https://oidc.prod.acme.example/edge", TrustDomain: "edge.acme.example", ServedHere: true,
		DiscoveryURL: "https://oidc.prod.acme.example/edge/.well-known/openid-configuration", JWKSURL: "https://oidc.prod.acme.example/edge/keys",
		Keys: []api.OIDCIssuerKey{}, Algorithms: []string{}, Error: "no JWT authority to publish",
		Certificate: &api.OIDCIssuerCertificate{Names: []string{"bundle.prod.acme.example"}, ACME: true, Reason: "host oidc.prod.acme.example is not among the --acme-domain names"},
	}
	s := api.Snapshot{Time: fixtureNow, TrustDomain: "prod.acme.example", OIDCIssuers: []api.OIDCIssuer{ours, relayed},
		TrustDomains: []api.TrustDomain{{Name: "prod.acme.example", Local: true, Sources: []string{"ca"}}}}

	rec := serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assertInert(t, d)
	rows := d.withClass("issuer-row")
	require.Len(t, rows, 2)
	first := text(rows[0])
	for _, want := range []string{"https://oidc.prod.acme.example", "discovery https://oidc.prod.acme.example/.well-known/openid-configuration",
		"JWKS https://oidc.prod.acme.example/keys", "prod.acme.example", "ours · served by this server", "key without use",
		"k-active · ES256 · sig", "k-legacy · RS256 · no use", "covers the host", "valid for oidc.prod.acme.example, bundle.prod.acme.example"} {
		assert.Contains(t, first, want)
	}
	second := text(rows[1])
	for _, want := range []string{"edge.acme.example", "relayed · served by this server", "no key: 503", "no JWT authority to publish",
		"does not cover the host", "valid for bundle.prod.acme.example (ACME)", "not among the --acme-domain names"} {
		assert.Contains(t, second, want)
	}
	assert.True(t, hasClass(parseDOMNode(rows[1]).withClass("badge")[0], "failing"))

	s.OIDCIssuers = []api.OIDCIssuer{{URL: ours.URL, TrustDomain: ours.TrustDomain, Local: true, DiscoveryURL: ours.DiscoveryURL, JWKSURL: ours.JWKSURL, Keys: []api.OIDCIssuerKey{}}}
	rec = serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	row := text(parseDOM(t, rec.Body).withClass("issuer-row")[0])
	assert.Contains(t, row, "served by a relay")
	assert.Contains(t, row, "relay")
	assert.NotContains(t, row, "no key", "a relay's keys are not ours to report")

	s.OIDCIssuers = nil
	rec = serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	assert.Nil(t, parseDOM(t, rec.Body).byID("oidc-issuers"), "no panel without an issuer")
}

func TestIssuerState(t *testing.T) {
	ok := api.OIDCIssuer{ServedHere: true, Keys: []api.OIDCIssuerKey{{KID: "a", Use: "sig"}}, Certificate: &api.OIDCIssuerCertificate{CoversHost: true}}
	noUse := ok
	noUse.Keys = []api.OIDCIssuerKey{{KID: "a"}}
	uncovered := ok
	uncovered.Certificate = &api.OIDCIssuerCertificate{}
	cases := []struct {
		name        string
		iss         api.OIDCIssuer
		text, class string
	}{
		{"serving", ok, "serving", "ok"},
		{"key without use", noUse, "key without use", "stale"},
		{"host not covered", uncovered, "host not covered", "failing"},
		{"no key", api.OIDCIssuer{ServedHere: true}, "no key", "failing"},
		{"relay", api.OIDCIssuer{}, "relay", "external"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text, class := issuerState(tc.iss)
			assert.Equal(t, tc.text, text)
			assert.Equal(t, tc.class, class)
		})
	}
}
