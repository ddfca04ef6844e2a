// Package oidctest runs an OpenID Connect issuer for tests: an httptest
// TLS server on 127.0.0.1 serving the discovery document and a JWKS,
// minting tokens with keys it rotates on demand, and injecting faults.
// Clients must allow private addresses and trust Roots.
//
//	iss := oidctest.New(t)
//	token := iss.Mint(iss.StandardClaims("repo:acme/app", "spiffe://example.org"))
//	iss.Rotate()                    // a new key signs; the old one stays published
//	iss.SetStatus(http.StatusBadGateway)
//
// The server stops when the test ends.
package oidctest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Paths below the issuer URL.
const (
	DiscoveryPath = "/.well-known/openid-configuration"
	JWKSPath      = "/jwks"
)

// Issuer is a running test issuer. Its methods are safe for concurrent
// use.
type Issuer struct {
	tb     testing.TB
	srv    *httptest.Server
	url    string // issuer URL: server URL plus the optional path
	path   string
	alg    jose.SignatureAlgorithm
	maxAge time.Duration // Cache-Control max-age of the JWKS; negative: no header
	now    func() time.Time

	mu            sync.Mutex
	keys          []signingKey // the last one signs
	status        int          // non-zero: every path answers with it
	jwksBody      []byte       // non-nil: served instead of the keys
	discoveryBody []byte       // non-nil: served instead of the configuration
	handlers      map[string]http.Handler
	hits          map[string]int
	serial        int
}

type signingKey struct {
	kid  string
	priv crypto.Signer
}

// Option configures New.
type Option func(*Issuer)

// WithPath puts the issuer below a path of the server, e.g. "/tenant-a":
// its URL is then https://127.0.0.1:port/tenant-a.
func WithPath(p string) Option {
	return func(i *Issuer) { i.path = "/" + strings.Trim(p, "/") }
}

// WithMaxAge sets the JWKS answer's Cache-Control max-age (default 5m);
// a negative d sends no cache headers.
func WithMaxAge(d time.Duration) Option { return func(i *Issuer) { i.maxAge = d } }

// WithAlgorithm sets the signing algorithm of Mint (default RS256):
// RS256/384/512, PS256/384/512 or ES256/384/512.
func WithAlgorithm(alg jose.SignatureAlgorithm) Option { return func(i *Issuer) { i.alg = alg } }

// WithNow sets the time StandardClaims reads (default time.Now), e.g. a
// fake clock's Now.
func WithNow(now func() time.Time) Option { return func(i *Issuer) { i.now = now } }

// New starts an issuer with one key.
func New(tb testing.TB, opts ...Option) *Issuer {
	tb.Helper()
	i := &Issuer{tb: tb, alg: jose.RS256, maxAge: 5 * time.Minute, now: time.Now,
		handlers: map[string]http.Handler{}, hits: map[string]int{}}
	for _, o := range opts {
		o(i)
	}
	i.srv = httptest.NewUnstartedServer(http.HandlerFunc(i.serve))
	i.srv.StartTLS()
	tb.Cleanup(i.srv.Close)
	i.url = i.srv.URL + i.path
	i.Rotate()
	return i
}

// URL is the issuer URL, the "iss" of its tokens.
func (i *Issuer) URL() string { return i.url }

// Roots holds the server's certificate.
func (i *Issuer) Roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(i.srv.Certificate())
	return p
}

// CAPEM is the server's certificate in PEM, for a caFile.
func (i *Issuer) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: i.srv.Certificate().Raw})
}

// Client is an HTTP client that trusts the server.
func (i *Issuer) Client() *http.Client { return i.srv.Client() }

// Hits returns how many requests each path received.
func (i *Issuer) Hits() map[string]int {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make(map[string]int, len(i.hits))
	for p, n := range i.hits {
		out[p] = n
	}
	return out
}

// Rotate adds a new key, which signs from now on; the old keys stay in
// the JWKS.
func (i *Issuer) Rotate() {
	i.tb.Helper()
	priv, err := newKey(i.alg)
	if err != nil {
		i.tb.Fatalf("oidctest: %v", err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.serial++
	i.keys = append(i.keys, signingKey{kid: "key-" + strconv.Itoa(i.serial), priv: priv})
}

// DropOldKeys removes every key but the current one from the JWKS.
func (i *Issuer) DropOldKeys() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.keys = i.keys[len(i.keys)-1:]
}

// KeyID is the current key's kid.
func (i *Issuer) KeyID() string { return i.current().kid }

// SetStatus makes every path answer with code and an empty body; 0
// restores normal answers.
func (i *Issuer) SetStatus(code int) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.status = code
}

// SetJWKSBody serves body as the JWKS instead of the keys; nil restores.
func (i *Issuer) SetJWKSBody(body []byte) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.jwksBody = body
}

// SetDiscoveryBody serves body as the discovery document; nil restores.
func (i *Issuer) SetDiscoveryBody(body []byte) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.discoveryBody = body
}

// SetHandler answers requests for the server path p (e.g.
// iss.Path(oidctest.JWKSPath)) with h instead; nil restores. Hits still
// counts them.
func (i *Issuer) SetHandler(p string, h http.Handler) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if h == nil {
		delete(i.handlers, p)
		return
	}
	i.handlers[p] = h
}

// Path is the server path of one of the issuer's documents.
func (i *Issuer) Path(p string) string { return i.path + p }

// Discovery is the discovery document served by default.
func (i *Issuer) Discovery() map[string]any {
	return map[string]any{
		"issuer":                                i.url,
		"jwks_uri":                              i.url + JWKSPath,
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{string(i.alg)},
	}
}

// JWKS is the key set served by default: the public keys.
func (i *Issuer) JWKS() []byte {
	i.mu.Lock()
	defer i.mu.Unlock()
	var set jose.JSONWebKeySet
	for _, k := range i.keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.kid, Algorithm: string(i.alg), Use: "sig"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		i.tb.Errorf("oidctest: marshal JWKS: %v", err)
	}
	return b
}

func (i *Issuer) serve(w http.ResponseWriter, r *http.Request) {
	i.mu.Lock()
	i.hits[r.URL.Path]++
	h, status, jwks, disc := i.handlers[r.URL.Path], i.status, i.jwksBody, i.discoveryBody
	i.mu.Unlock()
	switch {
	case h != nil:
		h.ServeHTTP(w, r)
	case status != 0:
		w.WriteHeader(status)
	case r.URL.Path == i.path+DiscoveryPath:
		if disc == nil {
			disc, _ = json.Marshal(i.Discovery())
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(disc)
	case r.URL.Path == i.path+JWKSPath:
		if jwks == nil {
			jwks = i.JWKS()
		}
		if i.maxAge >= 0 {
			w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", int(i.maxAge.Seconds())))
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(jwks)
	default:
		http.NotFound(w, r)
	}
}

func (i *Issuer) current() signingKey {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.keys[len(i.keys)-1]
}

func newKey(alg jose.SignatureAlgorithm) (crypto.Signer, error) {
	switch alg {
	case jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512:
		return rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.ES384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case jose.ES512:
		return ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	}
	return nil, fmt.Errorf("algorithm %q is not supported", alg)
}
