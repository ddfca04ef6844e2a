package svidcheck_test

import (
	"crypto/x509"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/svidcheck"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var (
	idA = spiffeid.RequireFromString("spiffe://a.test/workload")
	idB = spiffeid.RequireFromString("spiffe://b.test/workload")
)

func bundles(cas ...*testca.CA) *x509bundle.Set {
	set := x509bundle.NewSet()
	for _, ca := range cas {
		set.Add(x509bundle.FromX509Authorities(ca.TrustDomain, []*x509.Certificate{ca.Cert}))
	}
	return set
}

// intermediate returns a CA of ca's trust domain signed by ca, with the
// extended key usages given (none: unrestricted).
func intermediate(t *testing.T, ca *testca.CA, usages ...x509.ExtKeyUsage) *testca.CA {
	key := testca.NewKey(t, testca.ECP256)
	cert := testca.Sign(t, &x509.Certificate{
		SerialNumber:          ca.Cert.SerialNumber, // another issuer, so no clash
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
		ExtKeyUsage:           usages,
		URIs:                  []*url.URL{ca.TrustDomain.ID().URL()},
	}, ca.Cert, key.Public(), ca.Key)
	return &testca.CA{TrustDomain: ca.TrustDomain, Cert: cert, Key: key}
}

func TestVerify(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	both := bundles(caA, caB)
	leafA, _ := caA.Issue(t, idA)
	serverOnly, _ := caA.Issue(t, idA, testca.Options{Mutate: func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}})
	noEKU, _ := caA.Issue(t, idA, testca.Options{Mutate: func(c *x509.Certificate) { c.ExtKeyUsage = nil }})
	serverInter := intermediate(t, caA, x509.ExtKeyUsageServerAuth)
	underServerInter, _ := serverInter.Issue(t, idA)
	plainInter := intermediate(t, caA)
	underPlainInter, _ := plainInter.Issue(t, idA)
	bSignedA, _ := caB.Issue(t, idA) // an a.test ID vouched for by b.test's root
	nonCanonical, _ := caA.Issue(t, idA, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = []*url.URL{{Scheme: "spiffe", Host: "a.test", Path: "/workload/"}}
	}})

	tests := []struct {
		name    string
		certs   []*x509.Certificate
		src     x509bundle.Source
		usage   x509.ExtKeyUsage
		want    error
		wantMsg string
	}{
		{name: "any usage", certs: []*x509.Certificate{leafA}, src: both, usage: x509.ExtKeyUsageAny},
		{name: "client usage", certs: []*x509.Certificate{leafA}, src: both, usage: x509.ExtKeyUsageClientAuth},
		{name: "no EKU allows every usage", certs: []*x509.Certificate{noEKU}, src: both, usage: x509.ExtKeyUsageClientAuth},
		{name: "server-only leaf as server", certs: []*x509.Certificate{serverOnly}, src: both, usage: x509.ExtKeyUsageServerAuth},
		{name: "server-only leaf as client", certs: []*x509.Certificate{serverOnly}, src: both, usage: x509.ExtKeyUsageClientAuth, want: svidcheck.ErrChain, wantMsg: "clientAuth"},
		{name: "server-only intermediate restricts its leaves", certs: []*x509.Certificate{underServerInter, serverInter.Cert}, src: both, usage: x509.ExtKeyUsageClientAuth, want: svidcheck.ErrChain},
		{name: "server-only intermediate, server use", certs: []*x509.Certificate{underServerInter, serverInter.Cert}, src: both, usage: x509.ExtKeyUsageServerAuth},
		{name: "unrestricted intermediate", certs: []*x509.Certificate{underPlainInter, plainInter.Cert}, src: both, usage: x509.ExtKeyUsageClientAuth},
		{name: "intermediate missing", certs: []*x509.Certificate{underPlainInter}, src: both, usage: x509.ExtKeyUsageAny, want: svidcheck.ErrChain},
		{name: "a.test ID under b.test root, both held", certs: []*x509.Certificate{bSignedA}, src: both, usage: x509.ExtKeyUsageAny, want: svidcheck.ErrChain},
		{name: "non-canonical URI SAN", certs: []*x509.Certificate{nonCanonical}, src: both, usage: x509.ExtKeyUsageAny, want: svidcheck.ErrNotSVID, wantMsg: "trailing slash"},
		{name: "trust domain not held", certs: []*x509.Certificate{leafA}, src: bundles(caB), usage: x509.ExtKeyUsageAny, want: svidcheck.ErrUnknownDomain},
		{name: "empty bundle", certs: []*x509.Certificate{leafA}, src: x509bundle.New(caA.TrustDomain), usage: x509.ExtKeyUsageAny, want: svidcheck.ErrUnknownDomain, wantMsg: "no X.509 roots"},
		{name: "source answers with another domain's roots", certs: []*x509.Certificate{bSignedA}, usage: x509.ExtKeyUsageAny,
			src: sourceFunc(func(spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
				return x509bundle.FromX509Authorities(caB.TrustDomain, []*x509.Certificate{caB.Cert}), nil
			}), want: svidcheck.ErrUnknownDomain, wantMsg: `roots of "b.test"`},
		{name: "no source", certs: []*x509.Certificate{leafA}, usage: x509.ExtKeyUsageAny, want: svidcheck.ErrUnknownDomain},
		{name: "no certificates", src: both, usage: x509.ExtKeyUsageAny, want: svidcheck.ErrNoCertificate},
		{name: "nil certificate", certs: []*x509.Certificate{leafA, nil}, src: both, usage: x509.ExtKeyUsageAny, want: svidcheck.ErrNotSVID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, chains, err := svidcheck.Verify(tt.certs, tt.src, tt.usage)
			if tt.want == nil {
				require.NoError(t, err)
				assert.Equal(t, idA, id)
				require.NotEmpty(t, chains)
				assert.Equal(t, caA.Cert, chains[0][len(chains[0])-1], "anchored at a.test's root")
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.want)
			assert.Empty(t, chains)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

// The usage check must agree with crypto/x509's own: for every case where
// both have an opinion, Verify accepts exactly when leaf.Verify with that
// usage does.
func TestVerifyUsageMatchesCryptoX509(t *testing.T) {
	caA := testca.New(t, "a.test")
	usageSets := [][]x509.ExtKeyUsage{nil, {x509.ExtKeyUsageServerAuth}, {x509.ExtKeyUsageClientAuth}, {x509.ExtKeyUsageAny}, {x509.ExtKeyUsageCodeSigning}}
	for _, interUsage := range usageSets {
		inter := intermediate(t, caA, interUsage...)
		for _, leafUsage := range usageSets {
			leaf, _ := inter.Issue(t, idA, testca.Options{Mutate: func(c *x509.Certificate) { c.ExtKeyUsage = leafUsage }})
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageAny} {
				roots := x509.NewCertPool()
				roots.AddCert(caA.Cert)
				inters := x509.NewCertPool()
				inters.AddCert(inter.Cert)
				_, want := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{usage}})
				_, _, got := svidcheck.Verify([]*x509.Certificate{leaf, inter.Cert}, bundles(caA), usage)
				assert.Equal(t, want == nil, got == nil, "intermediate %v, leaf %v, usage %v: crypto/x509 %v, svidcheck %v", interUsage, leafUsage, usage, want, got)
			}
		}
	}
}

func TestVerifyAtTime(t *testing.T) {
	caA := testca.New(t, "a.test")
	leaf, _ := caA.Issue(t, idA)
	_, _, err := svidcheck.Verify([]*x509.Certificate{leaf}, bundles(caA), x509.ExtKeyUsageAny, x509svid.WithTime(leaf.NotAfter.Add(time.Second)))
	assert.ErrorIs(t, err, svidcheck.ErrChain)
	assert.Contains(t, err.Error(), "expired")
}

// Go's chain builder would accept a b.test leaf under b.test's root from a
// pool holding every trust domain; Verify asks only for the leaf's own.
func TestVerifyNeverAsksForAnotherTrustDomain(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	leafB, _ := caB.Issue(t, idB)
	var asked []spiffeid.TrustDomain
	src := sourceFunc(func(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
		asked = append(asked, td)
		return bundles(caA, caB).GetX509BundleForTrustDomain(td)
	})
	_, _, err := svidcheck.Verify([]*x509.Certificate{leafB}, src, x509.ExtKeyUsageAny)
	require.NoError(t, err)
	assert.Equal(t, []spiffeid.TrustDomain{idB.TrustDomain()}, asked)
}

type sourceFunc func(spiffeid.TrustDomain) (*x509bundle.Bundle, error)

func (f sourceFunc) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return f(td)
}

// BenchmarkLeafID measures the leaf check that precedes every
// verification, and that internal/authn runs on every call, cached or
// not, against go-spiffe's x509svid.IDFromCert (sibling "baseline"), which
// trusts crypto/x509's re-serialized URL; same leaf, same run.
func BenchmarkLeafID(b *testing.B) {
	leaf, _ := testca.New(b, "a.test").Issue(b, idA)
	b.Run("baseline:x509svid.IDFromCert", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := x509svid.IDFromCert(leaf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ours", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := svidcheck.LeafID(leaf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
