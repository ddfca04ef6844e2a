package agent

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// benchIdentities is the issue's figure: 1,000 identities on one agent.
const benchIdentities = DefaultMaxIdentities

// BenchmarkIdentityCache measures what the cache costs a node agent
// holding 1,000 identities, each against what any agent needs for the
// same, measured in the same run:
//
//   - heap: acquiring 1,000 identities (a key and a certificate each,
//     signed by a local test CA instead of a server) and the heap held per
//     identity once they are all served (B/identity; stack-B/identity is
//     the renewal goroutines' stacks, outside the heap), against a bare
//     map of the same credentials (baseline-map);
//   - acquire: Acquire and Release of an identity already held, against a
//     mutex-guarded map lookup (baseline-map-lookup).
func BenchmarkIdentityCache(b *testing.B) {
	ca := testca.New(b, tdA.Name())
	ids := make([]spiffeid.ID, benchIdentities)
	for i := range ids {
		ids[i] = spiffeid.RequireFromString(fmt.Sprintf("spiffe://a.test/ns/ns-%d/sa/sa-%d", i%50, i))
	}
	issue := func(id spiffeid.ID, key crypto.Signer) []*x509.Certificate {
		return []*x509.Certificate{issueFor(b, ca, id, key.Public(), time.Now().Add(-time.Minute), 24*time.Hour)}
	}
	fetcher := IdentityFetcherFunc(func(_ context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error) {
		return issue(id, key), nil
	})

	b.Run("heap/cache", func(b *testing.B) {
		var heap, stack float64
		for b.Loop() {
			b.StopTimer()
			h0, s0 := settledMem()
			b.StartTimer()
			c, handles, stop := fillCache(b, fetcher, ids)
			b.StopTimer()
			h1, s1 := settledMem()
			heap += float64(h1-h0) / benchIdentities
			stack += float64(s1-s0) / benchIdentities
			runtime.KeepAlive(c)
			for _, h := range handles {
				h.Release()
			}
			stop()
			b.StartTimer()
		}
		b.ReportMetric(heap/float64(b.N), "B/identity")
		b.ReportMetric(stack/float64(b.N), "stack-B/identity")
	})
	b.Run("heap/baseline-map", func(b *testing.B) {
		var heap float64
		for b.Loop() {
			b.StopTimer()
			h0, _ := settledMem()
			b.StartTimer()
			m := make(map[spiffeid.ID]*sds.Credential)
			for _, id := range ids {
				key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
				require.NoError(b, err)
				m[id] = &sds.Credential{Chain: issue(id, key), Key: key}
			}
			b.StopTimer()
			h1, _ := settledMem()
			heap += float64(h1-h0) / benchIdentities
			runtime.KeepAlive(m)
			b.StartTimer()
		}
		b.ReportMetric(heap/float64(b.N), "B/identity")
	})

	b.Run("acquire/cache", func(b *testing.B) {
		c, handles, stop := fillCache(b, fetcher, ids)
		defer stop()
		defer func() {
			for _, h := range handles {
				h.Release()
			}
		}()
		ctx := context.Background()
		i := 0
		for b.Loop() {
			h, err := c.Acquire(ctx, ids[i%len(ids)])
			if err != nil {
				b.Fatal(err)
			}
			h.Release()
			i++
		}
	})
	b.Run("acquire/baseline-map-lookup", func(b *testing.B) {
		var mu sync.Mutex
		m := make(map[spiffeid.ID]*sds.Credential, len(ids))
		for _, id := range ids {
			m[id] = &sds.Credential{}
		}
		i := 0
		var sink *sds.Credential
		for b.Loop() {
			mu.Lock()
			sink = m[ids[i%len(ids)]]
			mu.Unlock()
			i++
		}
		runtime.KeepAlive(sink)
	})
}

// fillCache runs a cache holding ids, each acquired once; stop ends Run
// (release the handles first to let it drop nothing it should keep).
func fillCache(b *testing.B, fetcher IdentityFetcher, ids []spiffeid.ID) (*IdentityCache, []*IdentityHandle, func()) {
	b.Helper()
	c, err := NewIdentityCache(IdentityCacheConfig{Fetcher: fetcher, MaxIdentities: len(ids)})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	handles := make([]*IdentityHandle, len(ids))
	for i, id := range ids {
		handles[i], err = c.Acquire(ctx, id)
		require.NoError(b, err)
	}
	return c, handles, func() {
		cancel()
		require.NoError(b, <-done)
	}
}

// settledMem is the heap in use and the goroutine stacks after a full
// collection.
func settledMem() (heap, stack uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.StackInuse
}
