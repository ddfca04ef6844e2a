package authn

import (
	"context"
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// BenchmarkX509SVIDAuthenticate alternates, call by call, an authenticator
// whose cache is off (every call runs svidcheck.Verify, the baseline) and
// the default one, whose calls after the first hit the verify cache, on
// the same leaf and intermediate. "x-verify" is the ratio of their median
// latencies (cached / verified): what a call on a warm connection costs
// against a full verification. ns/op is the cached authenticator alone.
// It fails if the cached authenticator verified more than once.
func BenchmarkX509SVIDAuthenticate(b *testing.B) {
	local := testca.New(b, "example.org")
	inter := intermediate(b, local)
	leaf, _ := inter.Issue(b, workloadID)
	roots := x509bundle.NewSet(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}))
	req := Request{PeerCertificates: []*x509.Certificate{leaf, inter.Cert}, Peer: "192.0.2.1:4000"}

	verified := NewX509SVID(localTD, roots, nil, WithVerifyCacheSize(0), WithFailureCache(0, 0))
	cached := NewX509SVID(localTD, roots, nil)
	calls := countVerify(cached)
	ctx := context.Background()
	var latCached, latVerified []time.Duration
	timed := func(a *X509SVID, lat *[]time.Duration) {
		start := time.Now()
		if _, err := a.Authenticate(ctx, req); err != nil {
			b.Fatal(err)
		}
		*lat = append(*lat, time.Since(start))
	}
	var total time.Duration
	for b.Loop() {
		if len(latCached)%2 == 0 { // neither goes first every time
			timed(verified, &latVerified)
			timed(cached, &latCached)
		} else {
			timed(cached, &latCached)
			timed(verified, &latVerified)
		}
		total += latCached[len(latCached)-1]
	}
	if n := calls.Load(); n != 1 {
		b.Fatalf("the cached authenticator verified %d times, want once", n)
	}
	slices.Sort(latCached)
	slices.Sort(latVerified)
	b.ReportMetric(float64(total)/float64(b.N), "ns/op")
	b.ReportMetric(float64(latCached[len(latCached)/2])/float64(latVerified[len(latVerified)/2]), "x-verify")
}
