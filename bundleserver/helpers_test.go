package bundleserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	td       = spiffeid.RequireTrustDomainFromString("example.org")
	endpoint = spiffeid.RequireFromPath(td, "/trustbridge/bundle-endpoint")
	eastTD   = spiffeid.RequireTrustDomainFromString("east.example")
	westTD   = spiffeid.RequireTrustDomainFromString("west.example")
)

// source is a Source whose bundle tests replace.
type source struct {
	p atomic.Pointer[spiffebundle.Bundle]
}

func newSource(b *spiffebundle.Bundle) *source {
	s := &source{}
	s.p.Store(b)
	return s
}

func (s *source) Bundle() *spiffebundle.Bundle { return s.p.Load() }
func (s *source) Set(b *spiffebundle.Bundle)   { s.p.Store(b) }

// newBundle returns a bundle of td holding n fresh roots, with a sequence
// and refresh hint when they are not zero.
func newBundle(t testing.TB, trustDomain spiffeid.TrustDomain, n int, seq uint64, hint time.Duration) *spiffebundle.Bundle {
	t.Helper()
	certs := make([]*x509.Certificate, n)
	for i := range certs {
		certs[i] = testca.New(t, trustDomain.Name()).Cert
	}
	b := spiffebundle.FromX509Authorities(trustDomain, certs)
	if seq != 0 {
		b.SetSequenceNumber(seq)
	}
	if hint != 0 {
		b.SetRefreshHint(hint)
	}
	return b
}

// withRoot returns a copy of b with one more root and the next sequence,
// as a publisher rotating in a new root would.
func withRoot(t testing.TB, b *spiffebundle.Bundle) *spiffebundle.Bundle {
	t.Helper()
	next := b.Clone()
	next.AddX509Authority(testca.New(t, b.TrustDomain().Name()).Cert)
	seq, _ := b.SequenceNumber()
	next.SetSequenceNumber(seq + 1)
	return next
}

func newServer(t testing.TB, cfg bundleserver.Config) *bundleserver.Server {
	t.Helper()
	if cfg.TrustDomain.IsZero() {
		cfg.TrustDomain = td
	}
	s, err := bundleserver.New(cfg)
	require.NoError(t, err)
	return s
}

// tlsCert wraps a leaf and its key for GetCertificate.
func tlsCert(leaf *x509.Certificate, key any) *tls.Certificate {
	return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// svidCert mints the bundle endpoint's X509-SVID from ca.
func svidCert(t testing.TB, ca *testca.CA) *tls.Certificate {
	t.Helper()
	leaf, key := ca.Issue(t, endpoint)
	return tlsCert(leaf, key)
}

// webCert mints a Web PKI server certificate for localhost and 127.0.0.1.
func webCert(t testing.TB, ca *testca.CA) *tls.Certificate {
	t.Helper()
	leaf, key := ca.Issue(t, endpoint, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}})
	return tlsCert(leaf, key)
}

// rotatingCert serves whatever certificate it holds now.
type rotatingCert struct {
	p atomic.Pointer[tls.Certificate]
}

func (c *rotatingCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.p.Load(), nil }

func fixedCert(c *tls.Certificate) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c, nil }
}

// serve runs s.Serve on a loopback listener until the test ends, and
// checks that it then shuts down cleanly. It returns the base URL.
func serve(t testing.TB, s *bundleserver.Server) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &url.URL{Scheme: "https", Host: ln.Addr().String(), Path: "/"}
}

// client trusts roots, speaks HTTP/1.1 unless h2 is set, and is closed
// with the test.
func client(t testing.TB, roots *x509.CertPool, h2 bool) *http.Client {
	t.Helper()
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: h2,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
