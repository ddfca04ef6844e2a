package certservice_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
)

// BenchmarkCreateCertificate measures CreateCertificate over gRPC with
// mTLS (X509-SVID authentication against the CA's current roots), N
// clients on warm connections calling concurrently, against the bare
// signing it wraps: ca.Authority.Sign on the same CSR, already parsed, by N
// goroutines (sub-benchmark "baseline-sign", measured in the same run).
// The ratio is the price of the service: TLS, HTTP/2 and protobuf, the
// client certificate's chain verification, the CSR's parse and signature
// check, and PEM encoding of the response. Issue goal: throughput at least
// 0.70 of the baseline, a time ratio of at most about 1.43.
func BenchmarkCreateCertificate(b *testing.B) {
	bf := newBenchFixture(b)
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			b.Run("baseline-sign", func(b *testing.B) {
				concurrently(b, n, func(int) error { return bf.sign() })
			})
			b.Run("grpc-mtls", func(b *testing.B) {
				clients := bf.clients(b, n)
				concurrently(b, n, func(i int) error { return bf.call(clients[i]) })
			})
		})
	}
}

type benchFixture struct {
	f   *fixture
	csr *x509.CertificateRequest
	req *securityv1alpha1.IstioCertificateRequest
}

func newBenchFixture(b *testing.B) *benchFixture {
	f := newFixture(b, func(cfg *certservice.Config, _ *ca.Authority) {
		cfg.QueueSize = 1024
		cfg.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil)) // the production handler, without the buffer
	})
	key, err := ca.GenerateKey(ca.KeyECP256)
	if err != nil {
		b.Fatal(err)
	}
	// No URI SAN, so that one CSR serves every client identity; the
	// certificate carries each caller's own.
	csrPEM := newCSR(b, key)
	csr, err := ca.ParseCSR([]byte(csrPEM))
	if err != nil {
		b.Fatal(err)
	}
	return &benchFixture{f: f, csr: csr, req: &securityv1alpha1.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 3600}}
}

// sign is the baseline: the CA signing the pre-parsed CSR.
func (bf *benchFixture) sign() error {
	_, err := bf.f.authority.Sign(bf.csr, workloadID, time.Hour)
	return err
}

func (bf *benchFixture) call(c securityv1alpha1.IstioCertificateServiceClient) error {
	_, err := c.CreateCertificate(context.Background(), bf.req)
	return err
}

// clients returns n clients, each with its own SVID and a warm connection:
// the TLS handshake and HTTP/2 setup happen here, outside the timer.
func (bf *benchFixture) clients(b *testing.B, n int) []securityv1alpha1.IstioCertificateServiceClient {
	clients := make([]securityv1alpha1.IstioCertificateServiceClient, n)
	for i := range clients {
		id := spiffeid.RequireFromSegments(td, "bench", fmt.Sprint(i))
		clients[i] = bf.f.client(b, svid(b, bf.f.authority, id), "")
		if err := bf.call(clients[i]); err != nil {
			b.Fatal(err)
		}
	}
	return clients
}

// concurrently runs b.N calls of op spread over n goroutines, goroutine i
// passing i.
func concurrently(b *testing.B, n int, op func(i int) error) {
	b.ReportAllocs()
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Pointer[error]
	)
	b.ResetTimer()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
}
