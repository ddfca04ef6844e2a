package ca_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// FuzzSignCSR feeds arbitrary bytes through ParseCSR and Sign, as the
// certificate API will. Properties: nothing panics; every refusal wraps a
// sentinel the transport can map; and whatever is signed is an X509-SVID for
// the proven identity alone, which a go-spiffe peer accepts.
func FuzzSignCSR(f *testing.F) {
	root := testca.New(f, signTD.Name(), testca.Options{
		NotBefore: signNow.Add(-24 * time.Hour),
		NotAfter:  signNow.Add(365 * 24 * time.Hour),
	})
	m := rootMaterial(root)
	bundle := x509bundle.FromX509Authorities(signTD, m.Roots)

	ecKey := testca.NewKey(f, testca.ECP256)
	rsaKey := testca.NewKey(f, testca.RSA2048)
	ecDER := newCSR(f, ecKey, nil)
	rsaDER := newCSR(f, rsaKey, nil)
	withURI := func(s string) []byte {
		u, err := url.Parse(s)
		if err != nil {
			f.Fatal(err)
		}
		return csrPEM(newCSR(f, ecKey, &x509.CertificateRequest{URIs: []*url.URL{u}}))
	}
	for _, seed := range [][]byte{
		csrPEM(ecDER),
		ecDER,
		csrPEM(rsaDER),
		rsaDER,
		csrPEM(newCSR(f, testca.NewKey(f, testca.Ed25519), nil)),
		pem.EncodeToMemory(&pem.Block{Type: "NEW CERTIFICATE REQUEST", Bytes: ecDER}),
		withURI(workloadID.String()),
		withURI("spiffe://example.org/ns/kube-system/sa/admin"),
		withURI("spiffe://EXAMPLE.org/ns/default/sa/web"),
		csrPEM(newCSR(f, ecKey, &x509.CertificateRequest{DNSNames: []string{"web.example.org"}})),
		nil,
		[]byte("not a csr"),
		append(csrPEM(ecDER), csrPEM(rsaDER)...),
		append(csrPEM(ecDER), "trailing"...),
		append(bytes.Clone(ecDER), 0),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw}),
		padTo(csrPEM(ecDER), ca.MaxCSRSize+1),
	} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := ca.ParseCSR(data)
		if err != nil {
			if csr != nil || !errors.Is(err, ca.ErrInvalidCSR) {
				t.Fatalf("ParseCSR: csr %v, error %v not wrapping ErrInvalidCSR", csr != nil, err)
			}
			return
		}
		issued, err := ca.Sign(signNow, m, signPolicy, csr, workloadID, 0)
		if err != nil {
			// Material, policy and identity are fixed and good: only the
			// CSR can be at fault.
			if issued != nil || !(errors.Is(err, ca.ErrInvalidCSR) || errors.Is(err, ca.ErrIdentityNotAllowed)) {
				t.Fatalf("Sign: unexpected error %v", err)
			}
			return
		}
		leaf := issued.Leaf
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != workloadID.String() {
			t.Fatalf("leaf URIs %v, want exactly [%s]", leaf.URIs, workloadID)
		}
		if leaf.IsCA || !leaf.BasicConstraintsValid {
			t.Fatalf("leaf IsCA %v, BasicConstraintsValid %v", leaf.IsCA, leaf.BasicConstraintsValid)
		}
		if len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) > 0 {
			t.Fatalf("leaf has other SANs: %v %v %v", leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
		}
		raw := make([][]byte, 0, len(issued.Chain))
		for _, c := range issued.Chain {
			raw = append(raw, c.Raw)
		}
		id, _, err := x509svid.ParseAndVerify(raw, bundle, x509svid.WithTime(signNow))
		if err != nil {
			t.Fatalf("issued chain does not verify: %v", err)
		}
		if id != workloadID {
			t.Fatalf("verified ID %s, want %s", id, workloadID)
		}
	})
}
