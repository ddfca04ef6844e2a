package certservice_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

var (
	td       = spiffeid.RequireTrustDomainFromString("example.org")
	serverID = spiffeid.RequireFromString("spiffe://example.org/trustbridge/ca")
)

// newAuthority is a self-signed CA on a fresh data directory.
func newAuthority(tb testing.TB, trustDomain spiffeid.TrustDomain) *ca.Authority {
	tb.Helper()
	a, err := ca.New(ca.Config{TrustDomain: trustDomain, DataDir: tb.TempDir()})
	require.NoError(tb, err)
	return a
}

// localRoots is the CA's current bundle as an x509bundle.Source, read on
// every call the way the server wires it.
type localRoots struct{ a *ca.Authority }

func (l localRoots) GetX509BundleForTrustDomain(t spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if t != l.a.TrustDomain() {
		return nil, fmt.Errorf("no bundle for %s", t)
	}
	return l.a.Bundle().X509Bundle(), nil
}

// countingSigner counts the calls that reach the CA.
type countingSigner struct {
	next  certservice.Signer
	calls atomic.Int64
}

func (c *countingSigner) SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error) {
	c.calls.Add(1)
	return c.next.SignX509SVID(p)
}

// fixture is a certificate service on loopback with TLS, backed by a real
// CA.
type fixture struct {
	authority *ca.Authority
	signer    *countingSigner
	svc       *certservice.Service
	reg       *prometheus.Registry
	logs      *testlog.Buffer
	addr      string
	// stop stops the server and waits for Run to return (also at cleanup).
	stop func()
}

// newFixture starts a service. mutate may change the config; its Signer,
// when left nil, is the counting wrapper around the CA. opts are extra
// gRPC server options.
func newFixture(tb testing.TB, mutate func(*certservice.Config, *ca.Authority), opts ...grpc.ServerOption) *fixture {
	tb.Helper()
	return newFixtureOn(tb, newAuthority(tb, td), mutate, opts...)
}

// newFixtureOn is newFixture backed by authority.
func newFixtureOn(tb testing.TB, authority *ca.Authority, mutate func(*certservice.Config, *ca.Authority), opts ...grpc.ServerOption) *fixture {
	tb.Helper()
	f := &fixture{authority: authority, reg: prometheus.NewRegistry(), logs: &testlog.Buffer{}}
	f.signer = &countingSigner{next: f.authority}
	cfg := certservice.Config{
		Authenticator: authn.Chain{authn.NewX509SVID(td, localRoots{f.authority}, nil)},
		Logger:        newLogger(f.logs),
		Registerer:    f.reg,
	}
	if mutate != nil {
		mutate(&cfg, f.authority)
	}
	if cfg.Signer == nil {
		cfg.Signer = f.signer
	} else {
		f.signer.next = cfg.Signer
		cfg.Signer = f.signer
	}
	svc, err := certservice.New(cfg)
	require.NoError(tb, err)
	f.svc = svc

	sc, err := f.authority.ServingCert(serverID, time.Hour)
	require.NoError(tb, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	f.addr = ln.Addr().String()
	srv := certservice.NewServer(svc, certservice.TLSConfig(sc.GetCertificate), ln, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	f.stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(tb, <-done)
		})
	}
	tb.Cleanup(f.stop)
	return f
}

// client dials the fixture with an optional client certificate and bearer
// token, verifying the server's SVID against the CA's roots.
func (f *fixture) client(tb testing.TB, cert *tls.Certificate, token string) securityv1alpha1.IstioCertificateServiceClient {
	tb.Helper()
	return f.clientTLS(tb, f.tlsConfig(cert), token)
}

func (f *fixture) tlsConfig(cert *tls.Certificate) *tls.Config {
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified in VerifyConnection as an X509-SVID
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, _, err := x509svid.Verify(cs.PeerCertificates, f.authority.Bundle().X509Bundle())
			if err != nil {
				return err
			}
			if id != serverID {
				return fmt.Errorf("server is %s", id)
			}
			return nil
		},
	}
	if cert != nil {
		tlsCfg.Certificates = []tls.Certificate{*cert}
	}
	return tlsCfg
}

func (f *fixture) clientTLS(tb testing.TB, tlsCfg *tls.Config, token string) securityv1alpha1.IstioCertificateServiceClient {
	tb.Helper()
	return securityv1alpha1.NewIstioCertificateServiceClient(f.conn(tb, tlsCfg, token))
}

// identityClient is a client of the identity service, as client.
func (f *fixture) identityClient(tb testing.TB, cert *tls.Certificate, token string) identityapi.IdentityServiceClient {
	tb.Helper()
	return identityapi.NewIdentityServiceClient(f.conn(tb, f.tlsConfig(cert), token))
}

func (f *fixture) conn(tb testing.TB, tlsCfg *tls.Config, token string) *grpc.ClientConn {
	tb.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(f.addr, opts...)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// svid issues a client certificate for id from a.
func svid(tb testing.TB, a *ca.Authority, id spiffeid.ID) *tls.Certificate {
	tb.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(tb, err)
	issued, err := a.SignX509SVID(ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id, TTL: time.Hour})
	require.NoError(tb, err)
	cert := &tls.Certificate{PrivateKey: key, Leaf: issued.Leaf}
	for _, c := range issued.Chain[:len(issued.Chain)-len(issued.Roots)] {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return cert
}

// newCSR is a PEM CSR for key requesting the given URI SANs.
func newCSR(tb testing.TB, key crypto.Signer, uris ...string) string {
	tb.Helper()
	tmpl := &x509.CertificateRequest{}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		require.NoError(tb, err)
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(tb, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func freshCSR(tb testing.TB, uris ...string) string {
	tb.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(tb, err)
	return newCSR(tb, key, uris...)
}

// parseChain decodes a response's cert_chain in istiod's layout: one
// certificate per element, but for the last, which holds every root.
func parseChain(tb testing.TB, chain []string) []*x509.Certificate {
	tb.Helper()
	var out []*x509.Certificate
	for i, p := range chain {
		certs := parsePEMCerts(tb, p)
		if i < len(chain)-1 {
			require.Len(tb, certs, 1, "element %d holds one certificate", i)
		}
		out = append(out, certs...)
	}
	return out
}

// parsePEMCerts decodes the certificates of one element; there is at least
// one and nothing else.
func parsePEMCerts(tb testing.TB, p string) []*x509.Certificate {
	tb.Helper()
	var out []*x509.Certificate
	rest := []byte(p)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(tb, err)
		out = append(out, c)
	}
	require.NotEmpty(tb, out)
	require.Empty(tb, bytes.TrimSpace(rest), "nothing but certificates")
	return out
}

// fakeJWT has the shape of a Kubernetes service account token; only the
// fake API server judges it.
func fakeJWT(exp time.Time) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	// The claims of a service account token for default/web and our
	// audience: TokenReview refuses anything else before asking the (fake)
	// API server.
	return enc(map[string]string{"alg": "RS256"}) + "." + enc(map[string]any{
		"exp": exp.Unix(), "iss": "https://kubernetes.default.svc.cluster.local",
		"sub": "system:serviceaccount:default:web", "aud": []string{"example.org"},
	}) + ".c2lnbmF0dXJl"
}

var errSecret = errors.New("disk /secret/ca-key.pem unreadable")

func newLogger(w *testlog.Buffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func tlsCert(leaf *x509.Certificate, key crypto.Signer) *tls.Certificate {
	return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

func pemCSR(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
