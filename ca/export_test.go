package ca

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The tests of the signer were written against a CSR path: a CSR from
// ParseCSR, judged against the proven identity, then signed. The signer
// now takes only a public key (X509SVIDParams); these adapters put the
// CSR's judgement (checkCSR, what the intermediate path's edge runs)
// in front of it, so those tests keep checking both.

// Sign signs csr's key for id as SignX509SVID, after checkCSR.
func Sign(now time.Time, m SigningMaterial, p Policy, csr *x509.CertificateRequest, id spiffeid.ID, ttl time.Duration, extra ...pkix.Extension) (*Issued, error) {
	return SignWithDNSNames(now, m, p, csr, id, ttl, nil, extra...)
}

// SignWithDNSNames is Sign with X509SVIDParams.DNSNames.
func SignWithDNSNames(now time.Time, m SigningMaterial, p Policy, csr *x509.CertificateRequest, id spiffeid.ID, ttl time.Duration,
	dnsNames []string, extra ...pkix.Extension) (*Issued, error) {
	pub, err := checkedCSRKey(csr, id)
	if err != nil {
		return nil, err
	}
	return SignX509SVID(now, m, p, X509SVIDParams{PublicKey: pub, SPIFFEID: id, TTL: ttl, DNSNames: dnsNames, Extensions: extra})
}

// Sign is the package-level Sign with the Authority's material, policy,
// clock, lock and metrics, as SignX509SVID.
func (a *Authority) Sign(csr *x509.CertificateRequest, id spiffeid.ID, ttl time.Duration, extra ...pkix.Extension) (*Issued, error) {
	return a.SignWithDNSNames(csr, id, ttl, nil, extra...)
}

// SignWithDNSNames is Sign with X509SVIDParams.DNSNames.
func (a *Authority) SignWithDNSNames(csr *x509.CertificateRequest, id spiffeid.ID, ttl time.Duration, dnsNames []string, extra ...pkix.Extension) (*Issued, error) {
	return a.signer.signWith(func(now time.Time, m SigningMaterial, pol Policy) (*Issued, error) {
		return SignWithDNSNames(now, m, pol, csr, id, ttl, dnsNames, extra...)
	})
}

// checkedCSRKey is csr's key once checkCSR accepted what csr asks for.
func checkedCSRKey(csr *x509.CertificateRequest, id spiffeid.ID) (crypto.PublicKey, error) {
	if err := checkCSR(csr, id); err != nil {
		return nil, err
	}
	return csr.PublicKey, nil
}

// DefaultLeafTTL is a Policy's DefaultTTL when it names none.
const DefaultLeafTTL = defaultLeafTTL

// ChainPEM encodes Chain without the roots, leaf first: the cert-chain.pem
// a workload presents in TLS (the shape caclient.WriteCredentials writes).
func (i *Issued) ChainPEM() []byte {
	n := max(len(i.Chain)-len(i.Roots), 0)
	return encodeCerts(i.Chain[:n])
}

// RootsPEM encodes Roots: the root-cert.pem a workload verifies peers with.
func (i *Issued) RootsPEM() []byte {
	return encodeCerts(i.Roots)
}

func encodeCerts(certs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		// pem.Encode only fails on invalid headers, and there are none.
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

// Rotate prepares a successor root now, as `ca rotate` does.
func (a *Authority) Rotate() error { return a.manager.rotate() }
