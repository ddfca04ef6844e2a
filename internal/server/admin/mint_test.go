package admin

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// fakeMinter signs as the CA would, with root, leaves valid from at for
// the TTL asked (an hour by default); JWT-SVIDs are a fixed string.
type fakeMinter struct {
	t       *testing.T
	root    *testca.CA
	leafKey crypto.PublicKey // overrides the CSR's key (the wire's fixed bytes)
	at      time.Time        // when leaves start; zero: now

	mu   sync.Mutex
	x509 []ca.X509SVIDParams
	jwt  []spiffeid.ID
}

func (m *fakeMinter) SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error) {
	m.mu.Lock()
	m.x509 = append(m.x509, p)
	m.mu.Unlock()
	ttl := p.TTL
	if ttl == 0 {
		ttl = time.Hour
	}
	pub := p.PublicKey
	if m.leafKey != nil {
		pub = m.leafKey
	}
	at := m.at
	if at.IsZero() {
		at = time.Now().Truncate(time.Second)
	}
	leaf := testca.Sign(m.t, &x509.Certificate{SerialNumber: big.NewInt(0x5eed), NotBefore: at.Add(-10 * time.Second), NotAfter: at.Add(ttl),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs: []*url.URL{p.SPIFFEID.URL()}, DNSNames: p.DNSNames, BasicConstraintsValid: true}, m.root.Cert, pub, m.root.Key)
	return &ca.Issued{Leaf: leaf, Chain: []*x509.Certificate{leaf, m.root.Cert}, Roots: []*x509.Certificate{m.root.Cert}}, nil
}

func (m *fakeMinter) SignJWT(id spiffeid.ID, _ []string, ttl time.Duration) (string, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.jwt = append(m.jwt, id)
	if ttl == 0 || ttl > time.Hour {
		ttl = time.Hour
	}
	return "eyJhbGciOiJFUzI1NiIsImtpZCI6ImstYWN0aXZlIn0.e30.c2ln", t0.Add(ttl), nil
}

// mintFixture is the admin API with a fake minter, a token and an audit
// recorder.
func mintFixture(t *testing.T) (*Handler, *fakeMinter, *[]audit.Entry) {
	t.Helper()
	f := newFixture(t)
	m := &fakeMinter{t: t, root: testca.New(t, localTD.Name())}
	var entries []audit.Entry
	f.cfg.Mint, f.cfg.Token, f.cfg.MaxWorkloadTTL = m, "s3cret", 24*time.Hour
	f.cfg.Audit = func(e audit.Entry) { entries = append(entries, e) }
	f.cfg.Reserved = []spiffeid.ID{spiffeid.RequireFromPath(localTD, "/trustbridge/ca"), spiffeid.RequireFromPath(localTD, "/infra/bundle")}
	f.cfg.ReservedPath = "/trustbridge"
	f.cfg.ReservedDNSNames = []string{"ca.example.org", "bundle.example.org", "*.admin.example.org"}
	return New(f.cfg), m, &entries
}

// csrPEM is a CSR of a fresh P-256 key, naming nothing.
func csrPEM(t *testing.T) (string, *ecdsa.PrivateKey) {
	t.Helper()
	return csrPEMWithKey(t)
}

func csrPEMFor(tb testing.TB) string {
	tb.Helper()
	s, _ := csrPEMWithKey(tb)
	return s
}

func csrPEMWithKey(t testing.TB) (string, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), key
}

// post sends body to target with the header pairs given.
func post(t *testing.T, h http.Handler, target, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func jsonBody(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestMintX509(t *testing.T) {
	h, m, entries := mintFixture(t)
	csr, key := csrPEM(t)
	body := jsonBody(t, api.X509SVIDMint{SPIFFEID: "spiffe://example.org/ops/probe", CSR: csr, DNSNames: []string{"probe.example.org"}, TTLSeconds: 48 * 3600})
	rec := post(t, h, "/v1/svid/x509", body, "Authorization", "Bearer s3cret")
	require.Equal(t, http.StatusOK, rec.Code, body)
	var got api.X509SVIDMinted
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))

	require.Len(t, m.x509, 1)
	assert.Equal(t, 24*time.Hour, m.x509[0].TTL, "clamped to --max-workload-ttl")
	assert.True(t, key.PublicKey.Equal(m.x509[0].PublicKey), "the CSR's key, which stays with the operator, is what is signed")
	assert.Equal(t, []string{"lifetime 48h0m0s clamped to the server's maximum 24h0m0s (--max-workload-ttl)"}, got.Warnings)
	chain, err := pemfile.ParseCertificates([]byte(got.CertChain))
	require.NoError(t, err)
	roots, err := pemfile.ParseCertificates([]byte(got.Bundle))
	require.NoError(t, err)
	svid, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(localTD, roots))
	require.NoError(t, err, "the chain verifies against the bundle answered")
	assert.Equal(t, "spiffe://example.org/ops/probe", svid.String())
	assert.Len(t, chain, 1, "the root is in the bundle, not the chain")

	require.Len(t, *entries, 1)
	e := (*entries)[0]
	assert.Equal(t, "x509_svid_minted", e.Event)
	assert.Equal(t, "example.org", e.TrustDomain)
	assert.Contains(t, e.Reason, "X509-SVID spiffe://example.org/ops/probe (serial 5eed, expires ")
	assert.Contains(t, e.Reason, "DNS probe.example.org) minted by admin-token (admin API)")
}

func TestMintJWT(t *testing.T) {
	h, m, entries := mintFixture(t)
	req := httptest.NewRequest(http.MethodPost, "/v1/svid/jwt", strings.NewReader(jsonBody(t, api.JWTSVIDMint{SPIFFEID: "spiffe://example.org/ops/probe", Audience: []string{"a", "b"}, TTLSeconds: 7200})))
	req = req.WithContext(OverSocket(req.Context()))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var got api.JWTSVIDMinted
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	assert.Equal(t, "spiffe://example.org/ops/probe", got.SPIFFEID)
	assert.Equal(t, t0.Add(time.Hour), got.ExpiresAt)
	assert.Len(t, got.Warnings, 1, "the CA's clamp is reported")
	require.Len(t, m.jwt, 1)
	require.Len(t, *entries, 1)
	assert.Equal(t, "jwt_svid_minted", (*entries)[0].Event)
	assert.Contains(t, (*entries)[0].Reason, "JWT-SVID spiffe://example.org/ops/probe for audience a b (key k-active, expires ")
	assert.Contains(t, (*entries)[0].Reason, "minted by admin-socket (admin API)")
	assert.NotContains(t, (*entries)[0].Reason, got.Token, "the token itself never reaches the audit log")
}

// Every refusal leaves the CA untouched and nothing in the audit log.
func TestMintRefusals(t *testing.T) {
	csr, _ := csrPEM(t)
	x := func(id string) string { return jsonBody(t, api.X509SVIDMint{SPIFFEID: id, CSR: csr}) }
	dns := func(names ...string) string {
		return jsonBody(t, api.X509SVIDMint{SPIFFEID: "spiffe://example.org/a", CSR: csr, DNSNames: names})
	}
	bearer := []string{"Authorization", "Bearer s3cret"}
	for _, tc := range []struct {
		name, target, body string
		header             []string
		code               int
		want               string
	}{
		{"no token", "/v1/svid/x509", x("spiffe://example.org/a"), nil, http.StatusUnauthorized, "missing admin token"},
		{"wrong token", "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/a","audience":["a"]}`, []string{"Authorization", "Bearer nope"}, http.StatusUnauthorized, "wrong admin token"},
		{"cross-site", "/v1/svid/x509", x("spiffe://example.org/a"), append([]string{"Sec-Fetch-Site", "cross-site"}, bearer...), http.StatusForbidden, ""},
		{"foreign trust domain", "/v1/svid/x509", x("spiffe://peer.example/a"), bearer, http.StatusBadRequest, "is of trust domain peer.example: this server signs for example.org only"},
		{"foreign trust domain, jwt", "/v1/svid/jwt", `{"spiffe_id":"spiffe://peer.example/a","audience":["a"]}`, bearer, http.StatusBadRequest, "this server signs for example.org only"},
		{"no path", "/v1/svid/x509", x("spiffe://example.org"), bearer, http.StatusBadRequest, "names the trust domain itself"},
		{"the server's own ID", "/v1/svid/x509", x("spiffe://example.org/trustbridge/ca"), bearer, http.StatusBadRequest, "is this server's own identity"},
		{"the server's own ID, jwt", "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/trustbridge/ca","audience":["a"]}`, bearer, http.StatusBadRequest, "is this server's own identity"},
		{"under the server's own path", "/v1/svid/x509", x("spiffe://example.org/trustbridge/bundle-endpoint"), bearer, http.StatusBadRequest, "the server keeps spiffe://example.org/trustbridge/* and spiffe://example.org/infra/bundle for itself"},
		{"the server's own path itself", "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/trustbridge","audience":["a"]}`, bearer, http.StatusBadRequest, "is this server's own identity"},
		{"a custom bundle endpoint ID", "/v1/svid/x509", x("spiffe://example.org/infra/bundle"), bearer, http.StatusBadRequest, "is this server's own identity"},
		{"the certificate service's DNS name", "/v1/svid/x509", dns("probe.example.org", "CA.example.org."), bearer, http.StatusBadRequest, `dns_names "CA.example.org.": ca.example.org is a host name this server serves under`},
		{"a wildcard over the bundle endpoint", "/v1/svid/x509", dns("*.example.org"), bearer, http.StatusBadRequest, `dns_names "*.example.org": ca.example.org is a host name`},
		{"a name under an own wildcard", "/v1/svid/x509", dns("ops.admin.example.org"), bearer, http.StatusBadRequest, `*.admin.example.org is a host name this server serves under`},
		{"not an ID", "/v1/svid/x509", x("example.org/a"), bearer, http.StatusBadRequest, `spiffe_id "example.org/a"`},
		{"bad CSR", "/v1/svid/x509", `{"spiffe_id":"spiffe://example.org/a","csr":"junk"}`, bearer, http.StatusBadRequest, "csr: "},
		{"unknown field", "/v1/svid/x509", `{"spiffe_id":"spiffe://example.org/a","key":"x"}`, bearer, http.StatusBadRequest, `unknown field "key"`},
		{"two values", "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/a","audience":["a"]}{}`, bearer, http.StatusBadRequest, "more than one JSON value"},
		{"too large", "/v1/svid/jwt", `{"spiffe_id":"` + strings.Repeat("a", maxMintBody) + `"}`, bearer, http.StatusRequestEntityTooLarge, ""},
		{"negative ttl", "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/a","audience":["a"],"ttl_seconds":-1}`, bearer, http.StatusBadRequest, "ttl_seconds -1"},
		{"no audience", "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/a"}`, bearer, http.StatusBadRequest, "audience is required"},
		{"control character", "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/a","audience":["a\u001b[2J"]}`, bearer, http.StatusBadRequest, "audience 1 holds a control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m, entries := mintFixture(t)
			rec := post(t, h, tc.target, tc.body, tc.header...)
			assert.Equal(t, tc.code, rec.Code, rec.Body.String())
			assert.Contains(t, rec.Body.String(), tc.want)
			assert.Empty(t, m.x509)
			assert.Empty(t, m.jwt)
			assert.Empty(t, *entries)
		})
	}
}

func TestMintFollowerAndUnmounted(t *testing.T) {
	f := newFixture(t)
	m := &fakeMinter{t: t, root: testca.New(t, localTD.Name())}
	f.cfg.Mint, f.cfg.Token, f.cfg.IsLeader = m, "s3cret", func() bool { return false }
	rec := post(t, New(f.cfg), "/v1/svid/jwt", `{"spiffe_id":"spiffe://example.org/a","audience":["a"]}`, "Authorization", "Bearer s3cret")
	assert.Equal(t, http.StatusConflict, rec.Code, "only the leader writes the audit log")
	assert.Empty(t, m.jwt)

	f.cfg.Mint = nil
	rec = post(t, New(f.cfg), "/v1/svid/jwt", `{}`, "Authorization", "Bearer s3cret")
	assert.Equal(t, http.StatusNotFound, rec.Code)
}

// The mint answers are wire documents too (see TestWireDocuments).
func TestWireMint(t *testing.T) {
	f := newFixture(t)
	root := &testca.CA{TrustDomain: localTD, Cert: fixedRoot(t, localTD.Name(), 1), Key: seededKey(1)}
	f.cfg.Mint = &fakeMinter{t: t, root: root, leafKey: seededKey(12).Public(), at: t0}
	f.cfg.Token, f.cfg.MaxWorkloadTTL = "s3cret", 24*time.Hour
	h := New(f.cfg)
	csr, _ := csrPEM(t)
	for name, tc := range map[string]struct{ target, body string }{
		"mint-x509": {"/v1/svid/x509", jsonBody(t, api.X509SVIDMint{SPIFFEID: "spiffe://example.org/ops/probe", CSR: csr, DNSNames: []string{"probe.example.org"}, TTLSeconds: 48 * 3600})},
		"mint-jwt":  {"/v1/svid/jwt", jsonBody(t, api.JWTSVIDMint{SPIFFEID: "spiffe://example.org/ops/probe", Audience: []string{"https://api.example.com"}, TTLSeconds: 600})},
	} {
		t.Run(name, func(t *testing.T) {
			rec := post(t, h, tc.target, tc.body, "Authorization", "Bearer s3cret")
			got := body(t, rec)
			require.Equal(t, http.StatusOK, rec.Code, got)
			path := filepath.Join("testdata", "wire", name+".json")
			if *updateWire {
				require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "go test ./internal/server/admin -run TestWire -update writes it")
			assert.Equal(t, string(want), got, "%s changed on the wire; if that is meant, rewrite testdata/wire with -update and say so in CHANGELOG.md", tc.target)
		})
	}
}

func TestHostMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"ca.example.org", "ca.example.org", true},
		{"CA.Example.org.", "ca.example.org", true},
		{"*.example.org", "ca.example.org", true},
		{"*.example.org", "a.ca.example.org", false}, // one label only
		{"*.example.org", "example.org", false},
		{"ca.example.org", "*.example.org", false},
		{"ca.example.org", "ca.example.org.evil", false},
		{"", "", false},
	} {
		assert.Equal(t, tc.want, hostMatches(tc.pattern, tc.name), "%q covers %q", tc.pattern, tc.name)
	}
}
