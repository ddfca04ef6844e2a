package ca

import (
	"bytes"
	"crypto/x509"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func concatDER(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		b.Write(c.Raw)
	}
	return b.Bytes()
}

// FuzzCheckUpstreamChain feeds arbitrary certificates, split into chain
// and roots, through CheckUpstreamChain. Properties: nothing panics, every
// refusal wraps ErrInvalidUpstreamChain, and whatever is accepted is a CA
// certificate for the request's key that verifies to a returned root.
func FuzzCheckUpstreamChain(f *testing.F) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(f, clk)
	key := testca.NewKey(f, testca.ECP256)
	csr, err := x509.CreateCertificateRequest(nil, &x509.CertificateRequest{URIs: []*url.URL{tdExample.ID().URL()}}, key)
	if err != nil {
		f.Fatal(err)
	}
	good, err := u.SignIntermediate(f.Context(), csr, 48*time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(concatDER(good.Chain[0], good.Chain[1], u.root), uint8(2))
	f.Add(concatDER(good.Chain[0], u.root), uint8(1))
	f.Add(concatDER(good.Chain[1], good.Chain[0], u.root), uint8(2))
	f.Add(concatDER(good.Chain[0], good.Chain[1], u.root), uint8(3))
	for _, mode := range []string{"non-ca", "other-td", "bad-chain", "wrong-key", "expired"} {
		u.set(mode, nil)
		bad, err := u.SignIntermediate(f.Context(), csr, time.Hour)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(concatDER(append(bad.Chain, bad.Roots...)...), uint8(2))
	}
	f.Add([]byte("not DER"), uint8(0))
	f.Fuzz(func(t *testing.T, der []byte, split uint8) {
		certs, err := x509.ParseCertificates(der)
		if err != nil || len(certs) == 0 {
			return
		}
		n := min(int(split), len(certs))
		c := &UpstreamChain{Chain: certs[:n], Roots: certs[n:]}
		err = CheckUpstreamChain(clk.Now(), tdExample, key.Public(), "fuzz", c)
		if err != nil {
			if !errors.Is(err, ErrInvalidUpstreamChain) {
				t.Fatalf("refusal does not wrap ErrInvalidUpstreamChain: %v", err)
			}
			return
		}
		first := c.Chain[0]
		if !first.IsCA || !publicKeysMatch(first.PublicKey, key.Public()) {
			t.Fatalf("accepted a chain whose first certificate is not a CA for our key")
		}
		roots := x509.NewCertPool()
		for _, r := range c.Roots {
			roots.AddCert(r)
		}
		inter := x509.NewCertPool()
		for _, i := range c.Chain[1:] {
			inter.AddCert(i)
		}
		if _, err := first.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: clk.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Fatalf("accepted a chain that does not verify: %v", err)
		}
	})
}

// FuzzSignIntermediate feeds arbitrary CSRs and TTLs through ParseCSR and
// SignIntermediate. Properties: nothing panics, refusals wrap a sentinel,
// and whatever is signed is a path-length-0 CA certificate for this trust
// domain alone that CheckUpstreamChain accepts for the CSR's key.
func FuzzSignIntermediate(f *testing.F) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := Config{TrustDomain: tdExample, DataDir: f.TempDir(), RootTTL: 24 * time.Hour, RefreshHint: time.Minute,
		WorkloadTTL: time.Hour, MaxWorkloadTTL: 2 * time.Hour, Clock: clk, Registerer: prometheus.NewRegistry(), SignsIntermediates: true}
	a, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	key := testca.NewKey(f, testca.ECP256)
	for _, tmpl := range []*x509.CertificateRequest{
		{URIs: []*url.URL{tdExample.ID().URL()}},
		{},
		{URIs: []*url.URL{{Scheme: "spiffe", Host: "other.org"}}},
		{DNSNames: []string{"x.example.org"}},
	} {
		der, err := x509.CreateCertificateRequest(nil, tmpl, key)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(der, int64(time.Hour))
	}
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"), int64(-1))
	f.Fuzz(func(t *testing.T, data []byte, ttl int64) {
		csr, err := ParseCSR(data)
		if err != nil {
			return
		}
		got, err := a.SignIntermediate(csr, time.Duration(ttl))
		if err != nil {
			if SignErrorKind(err) == "" {
				t.Fatalf("refusal wraps no sentinel: %v", err)
			}
			return
		}
		c := got.Chain[0]
		if !c.MaxPathLenZero || len(c.URIs) != 1 || c.URIs[0].String() != tdExample.ID().String() ||
			len(c.DNSNames)+len(c.IPAddresses)+len(c.EmailAddresses) > 0 {
			t.Fatalf("signed %v with names %v %v", c.Subject, c.URIs, c.DNSNames)
		}
		if err := CheckUpstreamChain(clk.Now(), tdExample, csr.PublicKey, "self", got); err != nil {
			t.Fatalf("signed an intermediate its own check refuses: %v", err)
		}
	})
}
