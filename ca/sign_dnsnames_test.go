package ca_test

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestSignWithDNSNames: the names the server decided sit beside the SPIFFE
// ID; the leaf is still an X509-SVID for a go-spiffe peer and passes a
// plain TLS client's host name check.
func TestSignWithDNSNames(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)

	issued, err := ca.SignWithDNSNames(signNow, rootMaterial(root), signPolicy, csr, workloadID, time.Hour,
		[]string{"Web.Default.svc.cluster.local"})
	require.NoError(t, err)
	leaf := issued.Leaf
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, workloadID.String(), leaf.URIs[0].String())
	assert.Equal(t, []string{"web.default.svc.cluster.local"}, leaf.DNSNames, "lowercased")
	assert.Empty(t, leaf.IPAddresses)
	verifySVID(t, issued, []*x509.Certificate{root.Cert})

	pool := x509.NewCertPool()
	pool.AddCert(root.Cert)
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "web.default.svc.cluster.local", Roots: pool, CurrentTime: signNow})
	assert.NoError(t, err)
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "db.default.svc.cluster.local", Roots: pool, CurrentTime: signNow})
	assert.Error(t, err)
}

// TestSignWithoutDNSNames: nil names is Sign.
func TestSignWithoutDNSNames(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)
	issued, err := ca.SignWithDNSNames(signNow, rootMaterial(root), signPolicy, csr, workloadID, time.Hour, nil)
	require.NoError(t, err)
	assert.Empty(t, issued.Leaf.DNSNames)
}

// TestSignWithDNSNamesRefuses: the server's names are checked as the
// serving certificate's are, and a CSR still cannot ask for any. A bad
// server-decided name is a fault of ours, so it wraps no sentinel (the
// client sees Internal, not InvalidArgument).
func TestSignWithDNSNamesRefuses(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	key := testca.NewKey(t, testca.ECP256)
	for _, tc := range []struct {
		name     string
		csr      *x509.CertificateRequest
		dnsNames []string
		wantErr  string
		sentinel error
	}{
		{"wildcard", nil, []string{"*.default.svc"}, "wildcards are not issued", nil},
		{"inner wildcard", nil, []string{"web.*.svc"}, "character '*'", nil},
		{"IP address", nil, []string{"10.0.0.1"}, "an IP address", nil},
		{"empty", nil, []string{""}, "empty", nil},
		{"repeat", nil, []string{"a.svc", "A.svc"}, "repeats", nil},
		{"too many", nil, manyNames(34), "34 DNS names for workload", nil},
		{"too long", nil, []string{strings.Repeat("a.", 127) + "b"}, "at most 253", nil},
		{"CSR asks for a DNS name", &x509.CertificateRequest{DNSNames: []string{"web.default.svc"}}, []string{"web.default.svc"}, "DNS SANs", ca.ErrInvalidCSR},
	} {
		t.Run(tc.name, func(t *testing.T) {
			issued, err := ca.SignWithDNSNames(signNow, rootMaterial(root), signPolicy, parsedCSR(t, key, tc.csr), workloadID, time.Hour, tc.dnsNames)
			require.Error(t, err)
			assert.Nil(t, issued)
			assert.ErrorContains(t, err, tc.wantErr)
			if tc.sentinel != nil {
				assert.ErrorIs(t, err, tc.sentinel)
				return
			}
			assert.Empty(t, ca.SignErrorKind(err), "a server-decided name is not the client's fault")
			assert.False(t, errors.Is(err, ca.ErrInvalidCSR))
		})
	}
}

// manyNames is n distinct workload DNS names.
func manyNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("w%d.default.svc", i)
	}
	return out
}

// TestSignWithDNSNamesMost: an identity map's names and the template's
// one fit in a leaf.
func TestSignWithDNSNamesMost(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	issued, err := ca.SignWithDNSNames(signNow, rootMaterial(root), signPolicy, parsedCSR(t, testca.NewKey(t, testca.ECP256), nil), workloadID, time.Hour, manyNames(33))
	require.NoError(t, err)
	assert.Len(t, issued.Leaf.DNSNames, 33)
}

// TestSignWithDNSNamesConstrained: under an intermediate whose DNS name
// constraints refuse a name, the leaf is refused with the constraint and
// the way out, not signed into one no verifier accepts; a name inside
// them is signed and verifies by host name.
func TestSignWithDNSNamesConstrained(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	inter, key := newSubCA(t, root.Cert, root.Key, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), func(c *x509.Certificate) {
		c.PermittedDNSDomains = []string{"svc.cluster.local"}
	})
	m := ca.SigningMaterial{Cert: inter, Key: key, Roots: []*x509.Certificate{root.Cert}}
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)

	issued, err := ca.SignWithDNSNames(signNow, m, signPolicy, csr, workloadID, time.Hour, []string{"web.shop.svc.cluster.local"})
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(root.Cert)
	inters := x509.NewCertPool()
	inters.AddCert(inter)
	_, err = issued.Leaf.Verify(x509.VerifyOptions{DNSName: "web.shop.svc.cluster.local", Roots: pool, Intermediates: inters, CurrentTime: signNow})
	assert.NoError(t, err)

	issued, err = ca.SignWithDNSNames(signNow, m, signPolicy, csr, workloadID, time.Hour, []string{"web.shop.svc.cluster.local", "web.corp.example"})
	require.ErrorIs(t, err, ca.ErrIdentityNotAllowed)
	assert.Nil(t, issued)
	assert.ErrorContains(t, err, `DNS name "web.corp.example" of `+workloadID.String())
	assert.ErrorContains(t, err, `permits DNS names only under ["svc.cluster.local"]`)
	assert.ErrorContains(t, err, "--downstream-dns-domain")

	// A constraint of the root above the signing certificate counts too.
	constrained := testca.New(t, signTD.Name(), testca.Options{NotBefore: signNow.Add(-time.Hour), Mutate: func(c *x509.Certificate) {
		c.ExcludedDNSDomains = []string{"corp.example"}
	}})
	inter, key = newSubCA(t, constrained.Cert, constrained.Key, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), nil)
	m = ca.SigningMaterial{Cert: inter, Key: key, Roots: []*x509.Certificate{root.Cert, constrained.Cert}}
	_, err = ca.SignWithDNSNames(signNow, m, signPolicy, csr, workloadID, time.Hour, []string{"web.corp.example"})
	require.ErrorIs(t, err, ca.ErrIdentityNotAllowed)
	assert.ErrorContains(t, err, `excludes DNS names under ["corp.example"]`)
}
