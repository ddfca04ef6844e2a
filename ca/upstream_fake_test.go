package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// fakeUpstream is an in-process upstream CA: a root and an intermediate
// under it, signing CSRs as CA certificates, with knobs to misbehave.
type fakeUpstream struct {
	tb  testing.TB
	clk clock.Clock

	mu       sync.Mutex
	root     *x509.Certificate
	rootKey  crypto.Signer
	mid      *x509.Certificate
	midKey   crypto.Signer
	fail     error  // returned as is
	mode     string // "", "non-ca", "other-td", "bad-chain", "wrong-key", "expired", "no-roots"
	calls    int
	serial   int64
	lifetime time.Duration // 0: the ttl asked for
}

func newFakeUpstream(tb testing.TB, clk clock.Clock) *fakeUpstream {
	u := &fakeUpstream{tb: tb, clk: clk, serial: 1000}
	u.newRoot()
	return u
}

func (u *fakeUpstream) String() string { return "fake upstream" }

// newRoot replaces the upstream's root and intermediate.
func (u *fakeUpstream) newRoot() {
	now := u.clk.Now()
	u.rootKey = testca.NewKey(u.tb, testca.ECP256)
	u.root = u.sign(&x509.Certificate{
		Subject:   pkix.Name{CommonName: "fake upstream root " + now.String()},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, u.rootKey.Public(), u.rootKey)
	u.midKey = testca.NewKey(u.tb, testca.ECP256)
	u.mid = u.sign(&x509.Certificate{
		Subject:   pkix.Name{CommonName: "fake upstream intermediate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(5 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, u.root, u.midKey.Public(), u.rootKey)
}

func (u *fakeUpstream) sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
	u.serial++
	tmpl.SerialNumber = big.NewInt(u.serial)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		u.tb.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		u.tb.Fatal(err)
	}
	return c
}

func (u *fakeUpstream) set(mode string, fail error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.mode, u.fail = mode, fail
}

func (u *fakeUpstream) callCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls
}

func (u *fakeUpstream) SignIntermediate(_ context.Context, csrDER []byte, ttl time.Duration) (*UpstreamChain, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls++
	if u.fail != nil {
		return nil, u.fail
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, err
	}
	if u.lifetime > 0 {
		ttl = u.lifetime
	}
	now := u.clk.Now()
	tmpl := &x509.Certificate{
		Subject:   pkix.Name{CommonName: "downstream"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs: csr.URIs,
	}
	pub := csr.PublicKey
	roots := []*x509.Certificate{u.root}
	switch u.mode {
	case "non-ca":
		tmpl.IsCA, tmpl.KeyUsage = false, x509.KeyUsageDigitalSignature
	case "other-td":
		tmpl.URIs = []*url.URL{{Scheme: "spiffe", Host: "other.org"}}
	case "wrong-key":
		pub = testca.NewKey(u.tb, testca.ECP256).Public()
	case "expired":
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-2*time.Hour), now.Add(-time.Hour)
	case "bad-chain":
		roots = []*x509.Certificate{testca.New(u.tb, "elsewhere.org").Cert}
	case "no-roots":
		roots = nil
	}
	cert := u.sign(tmpl, u.mid, pub, u.midKey)
	return &UpstreamChain{Chain: []*x509.Certificate{cert, u.mid}, Roots: roots}, nil
}

var errUpstreamDown = errors.New("connection refused")
