package trust_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var benchTDs = []int{100, 1000}

// benchEnv holds a store with n trust domains, a store with only the
// peer's trust domain, and one peer chain that both verify.
type benchEnv struct {
	full, single *trust.Verifier
	chain        [][]byte
}

func newBenchEnv(b *testing.B, n int) *benchEnv {
	b.Helper()
	full := trust.NewStore()
	var peer *testca.CA
	for i := range n {
		ca := testca.New(b, fmt.Sprintf("td-%04d.test", i))
		full.Set("federation", ca.Bundle())
		if i == n/2 {
			peer = ca
		}
	}
	leaf, _ := peer.Issue(b, spiffeid.RequireFromPath(peer.TrustDomain, "/workload"))
	single := trust.NewStore()
	single.Set("federation", peer.Bundle())
	auth := tlsconfig.AuthorizeMemberOf(peer.TrustDomain)
	return &benchEnv{
		full:   &trust.Verifier{Bundles: full, Authorizer: auth},
		single: &trust.Verifier{Bundles: single, Authorizer: auth},
		chain:  raw(leaf),
	}
}

// BenchmarkVerify measures peer verification with n trust domains in the
// store against a store holding only the peer's trust domain (sibling
// "baseline:tds=1"), same leaf, same run: the ratio is what the other
// trust domains cost. Goal: at most 1.1. A verification asks the store for
// one trust domain's bundle and never touches the others.
func BenchmarkVerify(b *testing.B) {
	for _, n := range benchTDs {
		e := newBenchEnv(b, n)
		run := func(v *trust.Verifier) func(b *testing.B) {
			return func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := v.VerifyPeer(e.chain); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		b.Run(fmt.Sprintf("tds=%d/baseline:tds=1", n), run(e.single))
		b.Run(fmt.Sprintf("tds=%d/ours", n), run(e.full))
	}
}

// BenchmarkVerifyInterleaved alternates the two verifiers of BenchmarkVerify
// call by call, so both see the same machine load, and reports the ratio of
// their median latencies (n trust domains / 1) as "x-tds1"; ns/op is the
// n-trust-domain verifier alone. On a shared machine the sequential
// sub-benchmarks of BenchmarkVerify swing with the load; this ratio does
// not.
func BenchmarkVerifyInterleaved(b *testing.B) {
	for _, n := range benchTDs {
		e := newBenchEnv(b, n)
		b.Run(fmt.Sprintf("tds=%d", n), func(b *testing.B) {
			var latFull, latSingle []time.Duration
			timed := func(v *trust.Verifier, lat *[]time.Duration) {
				start := time.Now()
				if _, err := v.VerifyPeer(e.chain); err != nil {
					b.Fatal(err)
				}
				*lat = append(*lat, time.Since(start))
			}
			var total time.Duration
			for b.Loop() {
				if len(latFull)%2 == 0 { // neither goes first every time
					timed(e.single, &latSingle)
					timed(e.full, &latFull)
				} else {
					timed(e.full, &latFull)
					timed(e.single, &latSingle)
				}
				total += latFull[len(latFull)-1]
			}
			slices.Sort(latFull)
			slices.Sort(latSingle)
			b.ReportMetric(float64(total)/float64(b.N), "ns/op")
			b.ReportMetric(float64(latFull[len(latFull)/2])/float64(latSingle[len(latSingle)/2]), "x-tds1")
		})
	}
}
