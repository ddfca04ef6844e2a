package ca_test

import (
	"crypto/x509"
	"errors"
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
		{"too many", nil, []string{"a.svc", "b.svc", "c.svc", "d.svc", "e.svc"}, "5 DNS names for workload", nil},
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
