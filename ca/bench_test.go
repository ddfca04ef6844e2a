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

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

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

// BenchmarkSignX509SVIDParallel signs X509-SVIDs from parallel goroutines
// through an Authority, against the package-level signer with the same
// kind of root and the same policy in the same run ("baseline:package").
// The ratio is what the Authority adds to every leaf under load: reading
// what it signs with, the clock and the metrics.
func BenchmarkSignX509SVIDParallel(b *testing.B) {
	root := testca.New(b, signTD.Name(), testca.Options{
		KeyType:   testca.ECP256,
		NotBefore: signNow.Add(-24 * time.Hour),
		NotAfter:  signNow.Add(365 * 24 * time.Hour),
	})
	params := ca.X509SVIDParams{PublicKey: testca.NewKey(b, testca.ECP256).Public(), SPIFFEID: workloadID}
	m := rootMaterial(root)
	b.Run("baseline:package", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := ca.SignX509SVID(signNow, m, signPolicy, params); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("Authority", func(b *testing.B) {
		a, err := ca.New(ca.Config{
			TrustDomain: signTD, DataDir: b.TempDir(), Clock: clocktesting.NewFakeClock(signNow), Registerer: prometheus.NewRegistry(),
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := a.SignX509SVID(params); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
