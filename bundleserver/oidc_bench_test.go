package bundleserver_test

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// BenchmarkOIDCInterleaved is BenchmarkInterleaved for the OIDC issuer's
// discovery document and JWKS (1 and 3 JWT keys: one active, a successor
// published, one retired): requests alternate between our server and a
// bare handler writing the same bytes, and "rps-vs-static" is the ratio
// of requests per second, ours/static, from the median latencies (goal:
// at least 0.90, as the bundle endpoint).
func BenchmarkOIDCInterleaved(b *testing.B) {
	for _, keys := range []int{1, 3} {
		for _, doc := range []string{"discovery", "jwks"} {
			e, path := newOIDCBenchEnv(b, keys, doc)
			static := e.start(b, e.static())
			ours := e.start(b, e.server.Handler())
			b.Run(fmt.Sprintf("%s/keys=%d", doc, keys), func(b *testing.B) {
				ns, ratio := interleave(b, e.getter(b, static+path[1:]), e.getter(b, ours+path[1:]))
				b.ReportMetric(ns, "ns/op")
				b.ReportMetric(1/ratio, "rps-vs-static")
			})
		}
	}
}

// newOIDCBenchEnv is a bench env whose server publishes an issuer with
// keys JWT keys, and whose body is the document doc serves, with its path.
func newOIDCBenchEnv(b *testing.B, keys int, doc string) (*benchEnv, string) {
	b.Helper()
	jwtKeys := make([]jwtKey, keys)
	for i := range jwtKeys {
		jwtKeys[i] = newJWTKey(b, fmt.Sprintf("kid-%d", i))
	}
	bundle := withJWT(b, td, 1, jwtKeys...)
	src := newSource(bundle)
	web := testca.New(b, "webpki.test")
	const issuer = "https://localhost/oidc"
	s, err := bundleserver.New(bundleserver.Config{TrustDomain: td, Local: src, GetCertificate: fixedCert(webCert(b, web)),
		Issuers: []bundleserver.Issuer{{URL: issuer, TrustDomain: td, Source: src}}})
	if err != nil {
		b.Fatal(err)
	}
	path := "/oidc" + bundleserver.DiscoveryPath
	if doc == "jwks" {
		path = "/oidc" + bundleserver.JWKSPath
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		b.Fatalf("%s: %d", path, rec.Code)
	}
	return &benchEnv{server: s, bundle: bundle, body: rec.Body.Bytes(),
		clients: &tls.Config{RootCAs: pool(web.Cert), ServerName: "localhost", MinVersion: tls.VersionTLS12}}, path
}
