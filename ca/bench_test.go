package ca_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// BenchmarkSign compares our signing path with the bare standard-library
// work it wraps, measured in the same run (sub-benchmark "baseline:raw"):
// decode and parse the CSR, check its signature, create the certificate.
// The baseline's template yields the same certificate as ours, with the
// SubjectKeyId computed once outside the loop; computing it per call is
// charged to us. The ratio is the price of our checks, the key identifier,
// and returning a parsed leaf and chain. EC P-256 CA and workload key, the
// common case.
func BenchmarkSign(b *testing.B) {
	root := testca.New(b, signTD.Name(), testca.Options{
		KeyType:   testca.ECP256,
		NotBefore: signNow.Add(-24 * time.Hour),
		NotAfter:  signNow.Add(365 * 24 * time.Hour),
	})
	key := testca.NewKey(b, testca.ECP256)
	data := csrPEM(newCSR(b, key, nil))
	pub, err := key.Public().(*ecdsa.PublicKey).Bytes()
	if err != nil {
		b.Fatal(err)
	}
	skid := sha256.Sum256(pub)
	m := rootMaterial(root)
	serialLimit := new(big.Int).Lsh(big.NewInt(1), 128)

	b.Run("baseline:raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			block, _ := pem.Decode(data)
			csr, err := x509.ParseCertificateRequest(block.Bytes)
			if err != nil {
				b.Fatal(err)
			}
			if err := csr.CheckSignature(); err != nil {
				b.Fatal(err)
			}
			serial, err := rand.Int(rand.Reader, serialLimit)
			if err != nil {
				b.Fatal(err)
			}
			tmpl := &x509.Certificate{
				SerialNumber:          serial,
				NotBefore:             signNow.Add(-10 * time.Second),
				NotAfter:              signNow.Add(ca.DefaultLeafTTL),
				KeyUsage:              x509.KeyUsageDigitalSignature,
				ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
				BasicConstraintsValid: true,
				URIs:                  []*url.URL{workloadID.URL()},
				SubjectKeyId:          skid[:20],
			}
			if _, err := x509.CreateCertificate(rand.Reader, tmpl, root.Cert, csr.PublicKey, root.Key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ca.Sign", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			csr, err := ca.ParseCSR(data)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ca.Sign(signNow, m, signPolicy, csr, workloadID, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A workload DNS name (--workload-dns-name-template): its check and
	// one more SAN, against ca.Sign above.
	b.Run("ca.SignWithDNSNames", func(b *testing.B) {
		b.ReportAllocs()
		names := []string{"web.default.svc.cluster.local"}
		for b.Loop() {
			csr, err := ca.ParseCSR(data)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ca.SignWithDNSNames(signNow, m, signPolicy, csr, workloadID, 0, names); err != nil {
				b.Fatal(err)
			}
		}
	})
}
