package bundleserver_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// Benchmarks measure a whole request as a peer makes it: HTTPS over
// loopback, HTTP/1.1 keep-alive, one client in the same process, on the
// server settings Serve uses (TLS, timeouts, header limits), for bundles
// of 1, 10 and 100 roots. Each sub-benchmark's ratio is against a
// baseline run in the same process:
//
//   - BenchmarkServe: "baseline:static" is a bare net/http handler
//     writing the same bytes. The ratio is what routing, conditional
//     requests, headers and metrics cost (goal: at most about 1.11).
//   - BenchmarkVsGoSPIFFE: "baseline:go-spiffe" is go-spiffe's
//     federation.NewHandler, which marshals the bundle on every request
//     (goal: ours at most 1/3 of it at 10 keys).
//
// p50-ns and p99-ns are per-request latencies of each run.
var benchKeys = []int{1, 10, 100}

func BenchmarkServe(b *testing.B) {
	for _, n := range benchKeys {
		e := newBenchEnv(b, n)
		static := e.start(b, e.static())
		ours := e.start(b, e.server.Handler())
		b.Run(fmt.Sprintf("keys=%d/baseline:static", n), func(b *testing.B) { e.run(b, static) })
		b.Run(fmt.Sprintf("keys=%d/ours", n), func(b *testing.B) { e.run(b, ours) })
	}
}

func BenchmarkVsGoSPIFFE(b *testing.B) {
	for _, n := range benchKeys {
		e := newBenchEnv(b, n)
		h, err := federation.NewHandler(td, e.bundle)
		if err != nil {
			b.Fatal(err)
		}
		theirs := e.start(b, h)
		ours := e.start(b, e.server.Handler())
		b.Run(fmt.Sprintf("keys=%d/baseline:go-spiffe", n), func(b *testing.B) { e.run(b, theirs) })
		b.Run(fmt.Sprintf("keys=%d/ours", n), func(b *testing.B) { e.run(b, ours) })
	}
}

// BenchmarkInterleaved alternates requests to our server and to the
// static baseline, so that both see the same machine load, and reports
// the ratio of their median latencies, ours/static, as "x-static" (ns/op
// is ours alone). BenchmarkServe runs its
// sub-benchmarks one after the other, and on a shared machine its ratio
// moves with the load; this one does not.
func BenchmarkInterleaved(b *testing.B) {
	for _, n := range benchKeys {
		e := newBenchEnv(b, n)
		static := e.start(b, e.static())
		ours := e.start(b, e.server.Handler())
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			ns, ratio := interleave(b, e.getter(b, static), e.getter(b, ours))
			b.ReportMetric(ns, "ns/op")
			b.ReportMetric(ratio, "x-static")
		})
	}
}

// interleave alternates getStatic and getOurs b.N times, neither going
// first every time, and returns ours' mean time per request and the ratio
// of the median latencies, ours/static: one stall of the machine must not
// decide the ratio.
func interleave(b *testing.B, getStatic, getOurs func()) (nsPerOp, oursOverStatic float64) {
	var latStatic, latOurs []time.Duration
	timed := func(get func(), lat *[]time.Duration) {
		start := time.Now()
		get()
		*lat = append(*lat, time.Since(start))
	}
	var total time.Duration
	for b.Loop() {
		if len(latOurs)%2 == 0 {
			timed(getStatic, &latStatic)
			timed(getOurs, &latOurs)
		} else {
			timed(getOurs, &latOurs)
			timed(getStatic, &latStatic)
		}
		total += latOurs[len(latOurs)-1]
	}
	slices.Sort(latStatic)
	slices.Sort(latOurs)
	return float64(total) / float64(b.N), float64(latOurs[len(latOurs)/2]) / float64(latStatic[len(latStatic)/2])
}

type benchEnv struct {
	server  *bundleserver.Server
	bundle  *spiffebundle.Bundle
	body    []byte
	clients *tls.Config
}

func newBenchEnv(b *testing.B, keys int) *benchEnv {
	b.Helper()
	bundle := newBundle(b, td, keys, 1, 5*time.Minute)
	body, err := bundledoc.Marshal(bundle)
	if err != nil {
		b.Fatal(err)
	}
	web := testca.New(b, "webpki.test")
	s, err := bundleserver.New(bundleserver.Config{TrustDomain: td, Local: newSource(bundle), GetCertificate: fixedCert(webCert(b, web))})
	if err != nil {
		b.Fatal(err)
	}
	return &benchEnv{server: s, bundle: bundle, body: body,
		clients: &tls.Config{RootCAs: pool(web.Cert), ServerName: "localhost", MinVersion: tls.VersionTLS12}}
}

// start serves h over TLS with the settings Serve uses until the
// benchmark ends, and returns its URL.
func (e *benchEnv) start(b *testing.B, h http.Handler) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := e.server.NewHTTPServer(h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeTLS(ln, "", "")
	}()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return "https://" + ln.Addr().String() + "/"
}

// static is the baseline: a bare handler writing the same bytes.
func (e *benchEnv) static() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(e.body)))
		_, _ = w.Write(e.body)
	})
}

// getter returns a function that fetches url on one keep-alive
// connection and checks the response, after a first fetch that pays for
// the handshake.
func (e *benchEnv) getter(b *testing.B, url string) func() {
	tr := &http.Transport{TLSClientConfig: e.clients.Clone()}
	b.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	get := func() {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || n != int64(len(e.body)) {
			b.Fatalf("status %d, %d bytes, %v", resp.StatusCode, n, err)
		}
	}
	get()
	return get
}

// run fetches url b.N times and reports latency percentiles.
func (e *benchEnv) run(b *testing.B, url string) {
	get := e.getter(b, url)
	lat := make([]time.Duration, 0, 1<<14)
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		get()
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)]), "p99-ns")
}
