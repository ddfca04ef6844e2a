package ca

import (
	"crypto/rand"
	"crypto/x509"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// BenchmarkUpstreamRenewalUnderLoad signs workload certificates from
// parallel goroutines; in "renewing" another goroutine meanwhile renews
// the intermediate back to back (the fake clock jumps past each renewal
// point, and each renewal asks the upstream, checks its answer and writes
// the state). No signing may fail across a renewal: one that does fails
// the benchmark. The ratio to "baseline:steady", the same Authority with
// no renewals, in the same run, is what renewals cost signing;
// renewals/op says how many happened.
func BenchmarkUpstreamRenewalUnderLoad(b *testing.B) {
	for _, renew := range []bool{false, true} {
		name := "baseline:steady"
		if renew {
			name = "renewing"
		}
		b.Run(name, func(b *testing.B) { benchSignDuringRenewals(b, renew) })
	}
}

func benchSignDuringRenewals(b *testing.B, renew bool) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(Config{
		TrustDomain: tdExample, DataDir: b.TempDir(), RefreshHint: time.Minute,
		WorkloadTTL: time.Hour, MaxWorkloadTTL: 2 * time.Hour, Clock: clk, Registerer: prometheus.NewRegistry(),
		Upstream: newFakeUpstream(b, clk), UpstreamTTL: 48 * time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	id := spiffeid.RequireFromPath(tdExample, "/w")
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id.URL()}}, testca.NewKey(b, testca.ECP256))
	if err != nil {
		b.Fatal(err)
	}
	csr, err := ParseCSR(der)
	if err != nil {
		b.Fatal(err)
	}
	var failed, renewals atomic.Int64
	var renewErr atomic.Value
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for renew {
			select {
			case <-stop:
				return
			default:
			}
			clk.Step(25 * time.Hour) // past half of the 48h intermediate's life
			if err := a.Reconcile(); err != nil {
				renewErr.Store(err)
				return
			}
			renewals.Add(1)
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := a.Sign(csr, id, 0); err != nil {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	close(stop)
	<-done
	if err := renewErr.Load(); err != nil {
		b.Fatalf("renewal failed: %v", err)
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d signings failed during renewals", n, b.N)
	}
	b.ReportMetric(float64(renewals.Load())/float64(b.N), "renewals/op")
}
