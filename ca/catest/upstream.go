package catest

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// Upstream is a ca.UpstreamAuthority signing with Root.
type Upstream struct {
	Root *testca.CA

	clk   clock.Clock
	mu    sync.Mutex
	err   error
	calls int
}

// NewUpstream returns an upstream whose root, for the upstream's trust domain td,
// is valid from clk's now for a year.
func NewUpstream(tb testing.TB, clk clock.Clock, td string) *Upstream {
	tb.Helper()
	now := clk.Now()
	return &Upstream{clk: clk, Root: testca.New(tb, td, testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour)})}
}

func (u *Upstream) String() string { return "test upstream" }

// Fail makes every later request fail with err; nil makes them succeed.
func (u *Upstream) Fail(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.err = err
}

// Calls is how many requests were made.
func (u *Upstream) Calls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls
}

// SignIntermediate signs the request's key as a CA for the request's
// URIs, path length 0, valid for ttl from the clock's now.
func (u *Upstream) SignIntermediate(_ context.Context, csrDER []byte, ttl time.Duration) (*ca.UpstreamChain, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls++
	if u.err != nil {
		return nil, u.err
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, err
	}
	now := u.clk.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, URIs: csr.URIs,
	}, u.Root.Cert, csr.PublicKey, u.Root.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &ca.UpstreamChain{Chain: []*x509.Certificate{cert}, Roots: []*x509.Certificate{u.Root.Cert}}, nil
}
