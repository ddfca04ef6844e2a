package bundleserver_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/trustbridge/trustbridge/bundleserver"
)

// BenchmarkFetchers measures what recording fetchers costs the bundle
// endpoint, against "baseline:unrecorded", the same server with the record
// switched off (the handler as it was before), in the same run:
//
//   - handler/*: the handler alone, in process, one request at a time,
//     where the record's share is largest. "one-client" is a peer
//     polling; "flood" is a new source address on every request, so
//     every request evicts one.
//   - parallel/*: the same from GOMAXPROCS goroutines, which contend for
//     the record's lock.
//
// BenchmarkFetchersInterleaved is the whole HTTPS request, the figure a
// peer sees.
func BenchmarkFetchers(b *testing.B) {
	e := newBenchEnv(b, 1)
	base := unrecorded(b, e)
	addrs := floodAddrs(4 * bundleserver.MaxLocalFetchers)
	b.Run("handler/baseline:unrecorded", func(b *testing.B) { serveLoop(b, base.Handler(), addrs[:1]) })
	b.Run("handler/one-client", func(b *testing.B) { serveLoop(b, e.server.Handler(), addrs[:1]) })
	b.Run("handler/flood", func(b *testing.B) { serveLoop(b, e.server.Handler(), addrs) })
	b.Run("parallel/baseline:unrecorded", func(b *testing.B) { serveParallel(b, base.Handler(), addrs) })
	b.Run("parallel/one-client", func(b *testing.B) { serveParallel(b, e.server.Handler(), addrs[:1]) })
	b.Run("parallel/flood", func(b *testing.B) { serveParallel(b, e.server.Handler(), addrs) })
}

// BenchmarkFetchersInterleaved alternates HTTPS requests, as in
// BenchmarkInterleaved, between the server with the record and without,
// and reports the ratio of their median latencies as "x-unrecorded".
func BenchmarkFetchersInterleaved(b *testing.B) {
	for _, n := range []int{1, 10} {
		e := newBenchEnv(b, n)
		base := e.start(b, unrecorded(b, e).Handler())
		ours := e.start(b, e.server.Handler())
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			ns, ratio := interleave(b, e.getter(b, base), e.getter(b, ours))
			b.ReportMetric(ns, "ns/op")
			b.ReportMetric(ratio, "x-unrecorded")
		})
	}
}

// unrecorded is a server like e's that records no fetchers.
func unrecorded(b *testing.B, e *benchEnv) *bundleserver.Server {
	b.Helper()
	s, err := bundleserver.New(bundleserver.Config{TrustDomain: td, Local: newSource(e.bundle)})
	if err != nil {
		b.Fatal(err)
	}
	s.DisableFetchers()
	return s
}

func floodAddrs(n int) []string {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("[2001:db8::%x]:443", i)
	}
	return addrs
}

// discard is a ResponseWriter that keeps its header map between requests,
// so that the benchmark measures the handler rather than the recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// serveLoop serves GET / to h from addrs in turn.
func serveLoop(b *testing.B, h http.Handler, addrs []string) {
	reqs := requests(addrs)
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		h.ServeHTTP(w, reqs[i%len(reqs)])
		i++
	}
}

func serveParallel(b *testing.B, h http.Handler, addrs []string) {
	reqs := requests(addrs)
	var goroutines atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &discard{h: http.Header{}}
		i := int(goroutines.Add(1)) * 97 // each goroutine starts elsewhere
		for pb.Next() {
			h.ServeHTTP(w, reqs[i%len(reqs)])
			i++
		}
	})
}

func requests(addrs []string) []*http.Request {
	reqs := make([]*http.Request, len(addrs))
	for i, a := range addrs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "/", nil)
		reqs[i].RemoteAddr = a
		reqs[i].Header.Set("User-Agent", "Go-http-client/1.1")
	}
	return reqs
}
