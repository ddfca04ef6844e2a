package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// servedIssuer is an issuer the bundle endpoint serves healthily: one
// key with use sig, on a certificate that covers its host.
func servedIssuer(url, td string, local bool) api.OIDCIssuer {
	return api.OIDCIssuer{
		URL: url, TrustDomain: td, Local: local, ServedHere: true,
		DiscoveryURL: url + "/.well-known/openid-configuration", JWKSURL: url + "/keys",
		Keys: []api.OIDCIssuerKey{{KID: "k1", Algorithm: "ES256", Use: "sig"}}, Algorithms: []string{"ES256"},
		Certificate: &api.OIDCIssuerCertificate{Names: []string{"oidc.example.com"}, CoversHost: true},
	}
}

func TestOIDCFindings(t *testing.T) {
	w := func(code, td string) found { return found{api.SeverityWarning, code, td} }
	ours := func(mutate func(*api.OIDCIssuer)) api.OIDCIssuer {
		iss := servedIssuer("https://oidc.example.com", "east.example", true)
		if mutate != nil {
			mutate(&iss)
		}
		return iss
	}
	relayed := func(mutate func(*api.OIDCIssuer)) api.OIDCIssuer {
		iss := servedIssuer("https://oidc.example.com/prod", "prod.example", false)
		if mutate != nil {
			mutate(&iss)
		}
		return iss
	}
	cases := []struct {
		name    string
		issuers []api.OIDCIssuer
		want    []found
	}{
		{"no issuer configured", nil, []found{}},
		{"healthy: ours and a relayed one", []api.OIDCIssuer{ours(nil), relayed(nil)}, []found{}},
		{"served by a relay: not judged here", []api.OIDCIssuer{{URL: "https://oidc.example.com", TrustDomain: "east.example", Local: true, Keys: []api.OIDCIssuerKey{}}}, []found{}},
		{"host not covered by the certificate files", []api.OIDCIssuer{ours(func(i *api.OIDCIssuer) {
			i.Certificate = &api.OIDCIssuerCertificate{Names: []string{"bundle.example.com"}, Reason: "x509: certificate is valid for bundle.example.com, not oidc.example.com"}
		})}, []found{w(CodeOIDCHostNotCovered, "east.example")}},
		{"host not among the ACME domains", []api.OIDCIssuer{relayed(func(i *api.OIDCIssuer) {
			i.Certificate = &api.OIDCIssuerCertificate{Names: []string{"bundle.example.com"}, ACME: true, Reason: "host oidc.example.com is not among the --acme-domain names"}
		})}, []found{w(CodeOIDCHostNotCovered, "prod.example")}},
		{"a key without use", []api.OIDCIssuer{ours(func(i *api.OIDCIssuer) {
			i.Keys = append(i.Keys, api.OIDCIssuerKey{KID: "k2", Algorithm: "ES256"})
		})}, []found{w(CodeOIDCKeyWithoutUse, "east.example")}},
		{"our issuer serves no key", []api.OIDCIssuer{ours(func(i *api.OIDCIssuer) {
			i.Keys, i.Algorithms = []api.OIDCIssuerKey{}, []string{}
			i.Error = "no JWT authority to publish; the discovery document and JWKS answer 503 until one is"
		})}, []found{w(CodeOIDCNoKey, "east.example")}},
		{"a relayed issuer serves no key", []api.OIDCIssuer{ours(nil), relayed(func(i *api.OIDCIssuer) { i.Keys = nil })},
			[]found{w(CodeOIDCNoKey, "prod.example")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", OIDCIssuers: tc.issuers})
			assert.Equal(t, tc.want, summary(fs))
			for _, f := range fs {
				assert.Contains(t, f.Message, "https://oidc.example.com", "the message names the issuer")
				assert.NotEmpty(t, f.Fix, "every finding says how to fix it")
			}
		})
	}
}

// Each fix says exactly what to change for the issuer at hand.
func TestOIDCFindingFixes(t *testing.T) {
	fix := func(iss api.OIDCIssuer) string {
		fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", OIDCIssuers: []api.OIDCIssuer{iss}})
		if !assert.Len(t, fs, 1) {
			return ""
		}
		return fs[0].Fix
	}
	files := servedIssuer("https://10.0.0.7/oidc", "east.example", true)
	files.Certificate = &api.OIDCIssuerCertificate{Names: []string{"bundle.example.com"}}
	assert.Contains(t, fix(files), "reissue --bundle-tls-cert with IP address 10.0.0.7 as a subject alternative name")

	acme := servedIssuer("https://oidc.example.com", "east.example", true)
	acme.Certificate = &api.OIDCIssuerCertificate{Names: []string{"bundle.example.com"}, ACME: true}
	assert.Contains(t, fix(acme), "add --acme-domain oidc.example.com")

	noUse := servedIssuer("https://oidc.example.com", "east.example", true)
	noUse.Keys[0].Use = ""
	assert.Contains(t, fix(noUse), `the JWKS this snapshot records for https://oidc.example.com/keys lacks "use"`)

	relayedEmpty := servedIssuer("https://oidc.example.com/prod", "prod.example", false)
	relayedEmpty.Keys = nil
	assert.Contains(t, fix(relayedEmpty), "--bundle-file prod.example=FILE")
	assert.Contains(t, fix(relayedEmpty), "--relay-jwt-issuer prod.example=https://oidc.example.com/prod")
}
