package federation

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// benchTrustDomains is the federation size the benchmarks target.
const benchTrustDomains = 1000

// benchWorkers bounds concurrent fetches in a poll round driven by Refresh.
const benchWorkers = 32

// benchFarm is one loopback https_web server publishing a distinct bundle
// per trust domain on /td-N, with a strong ETag like bundleserver's, so a
// steady-state poll costs a handshake and a 304.
type benchFarm struct {
	srv   *httptest.Server
	pool  *x509.CertPool
	names []string // trust domain names, index N served on /td-N
	docs  [][]byte
	etags []string
}

func newBenchFarm(tb testing.TB, n int, hint time.Duration) *benchFarm {
	tb.Helper()
	f := &benchFarm{names: make([]string, n), docs: make([][]byte, n), etags: make([]string, n)}
	for i := range n {
		f.names[i] = fmt.Sprintf("td-%04d.bench.test", i)
		bundle := testca.New(tb, f.names[i]).Bundle()
		bundle.SetSequenceNumber(1)
		bundle.SetRefreshHint(hint)
		doc, err := bundledoc.Marshal(bundle)
		require.NoError(tb, err)
		sum := sha256.Sum256(doc)
		f.docs[i], f.etags[i] = doc, `"`+hex.EncodeToString(sum[:16])+`"`
	}
	cert := benchServerCert(tb)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Config.ReadHeaderTimeout = 5 * time.Second
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	tb.Cleanup(srv.Close)
	f.srv = srv
	f.pool = x509.NewCertPool()
	f.pool.AddCert(cert.Leaf)
	return f
}

func (f *benchFarm) serve(w http.ResponseWriter, r *http.Request) {
	i, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/td-"))
	if err != nil || i < 0 || i >= len(f.docs) {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("ETag", f.etags[i])
	if r.Header.Get("If-None-Match") == f.etags[i] {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(f.docs[i])
}

// endpoints returns https_web endpoints for the farm's trust domains; those
// whose index is in dead point at deadAddr instead.
func (f *benchFarm) endpoints(tb testing.TB, deadAddr string, dead func(i int) bool) []Endpoint {
	eps := make([]Endpoint, len(f.names))
	for i, name := range f.names {
		base := f.srv.URL
		if dead != nil && dead(i) {
			base = "https://" + deadAddr
		}
		eps[i] = web(tb, name, fmt.Sprintf("%s/td-%d", base, i))
	}
	return eps
}

// benchServerCert mints an ECDSA P-256 certificate for 127.0.0.1 at run
// time: httptest's built-in RSA certificate would make the server's
// signatures, not the poller, the cost being measured.
func benchServerCert(tb testing.TB) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bench bundle endpoint"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(tb, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// benchBlackhole is a listener that accepts connections and never answers;
// each connection is closed once the client gives up, so a long run does
// not pile up descriptors.
func benchBlackhole(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			})
		}
	})
	tb.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
	})
	return l.Addr().String()
}

func newBenchPoller(tb testing.TB, eps []Endpoint, pool *x509.CertPool, timeout time.Duration, policy RefreshPolicy) *Poller {
	tb.Helper()
	p, err := NewPoller(PollerConfig{
		Endpoints: eps,
		Fetcher:   FetcherConfig{AllowPrivate: true, WebRoots: pool, Timeout: timeout},
		Policy:    policy,
		Sink:      &memSink{},
	})
	require.NoError(tb, err)
	return p
}

// forEach runs fn for every index in [0, n) on a pool of benchWorkers and
// returns the first error.
func forEach(n int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	next := make(chan int)
	for range min(benchWorkers, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

func refreshAll(ctx context.Context, p *Poller, eps []Endpoint) error {
	return forEach(len(eps), func(i int) error { return p.Refresh(ctx, eps[i].TrustDomain) })
}

func heapNow() runtime.MemStats {
	runtime.GC()
	runtime.GC() // the second pass frees what the first one's finalizers released
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

// BenchmarkPollerMemory reports the heap a poller holds per trust domain
// once every endpoint has been polled (issue 5 goal: 18 KiB). B/td counts
// heap spans in use, live-B/td the live objects within them; the farm's
// server side is built before the first reading.
func BenchmarkPollerMemory(b *testing.B) {
	f := newBenchFarm(b, benchTrustDomains, 5*time.Minute)
	eps := f.endpoints(b, "", nil)
	var inuse, live float64
	for b.Loop() {
		before := heapNow()
		p := newBenchPoller(b, eps, f.pool, 5*time.Second, RefreshPolicy{})
		require.NoError(b, refreshAll(b.Context(), p, eps))
		after := heapNow()
		runtime.KeepAlive(p)
		inuse = float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / benchTrustDomains
		live = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / benchTrustDomains
	}
	b.ReportMetric(inuse, "B/td")
	b.ReportMetric(live, "live-B/td")
}

// BenchmarkPollRound measures one steady-state poll round (each of the
// 1,000 endpoints answers 304 to its ETag) against a baseline of the same
// GETs made with a bare client: the ratio is the poller's own cost on top
// of a handshake per endpoint, which keep-alives off makes unavoidable.
func BenchmarkPollRound(b *testing.B) {
	f := newBenchFarm(b, benchTrustDomains, 5*time.Minute)
	eps := f.endpoints(b, "", nil)

	b.Run("poller", func(b *testing.B) {
		p := newBenchPoller(b, eps, f.pool, 5*time.Second, RefreshPolicy{})
		require.NoError(b, refreshAll(b.Context(), p, eps)) // first round fetches the bundles
		for b.Loop() {
			if err := refreshAll(b.Context(), p, eps); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchTrustDomains, "ns/td")
	})

	b.Run("baseline-https-get", func(b *testing.B) {
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: f.pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		}}
		get := func(i int) error {
			req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, eps[i].URL.String(), nil)
			if err != nil {
				return err
			}
			req.Header.Set("If-None-Match", f.etags[i])
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			if err == nil && resp.StatusCode != http.StatusNotModified {
				err = fmt.Errorf("status %s", resp.Status)
			}
			return err
		}
		for b.Loop() {
			if err := forEach(len(eps), get); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchTrustDomains, "ns/td")
	})
}

// BenchmarkLateness runs the poller's own schedule for a few seconds with
// every refresh due each second and 10% of the endpoints blackholed, and
// reports how late the healthy trust domains' polls start versus their
// scheduled time (issue 5 goal: p99 ≤ 1s). The baseline is the same run
// with no endpoint blackholed: a dead endpoint must not delay the others.
func BenchmarkLateness(b *testing.B) {
	f := newBenchFarm(b, benchTrustDomains, time.Second)
	hole := benchBlackhole(b)
	b.Run("blackholed-10pct", func(b *testing.B) {
		benchLateness(b, f, hole, func(i int) bool { return i%10 == 0 })
	})
	b.Run("baseline-none-blackholed", func(b *testing.B) {
		benchLateness(b, f, hole, func(int) bool { return false })
	})
}

// benchLateness reads lateness from Status, as an operator would: an
// attempt's LastAttempt (when its fetch started) against the NextRefresh
// seen before it. The poller publishes both together once the fetch is
// over, so sampling faster than the shortest interval sees every attempt.
func benchLateness(b *testing.B, f *benchFarm, hole string, dead func(i int) bool) {
	const (
		runFor  = 5 * time.Second
		sample  = 200 * time.Millisecond // well under the 0.9s shortest interval
		timeout = 500 * time.Millisecond
	)
	eps := f.endpoints(b, hole, dead)
	healthy := 0
	index := make(map[string]int, len(eps))
	for i, ep := range eps {
		index[ep.TrustDomain.Name()] = i
		if !dead(i) {
			healthy++
		}
	}
	policy := RefreshPolicy{Min: time.Second, Max: time.Second}

	var (
		late   []time.Duration
		failed int // healthy attempts that failed anyway
	)
	for b.Loop() {
		late, failed = late[:0], 0
		p := newBenchPoller(b, eps, f.pool, timeout, policy)
		ctx, cancel := context.WithCancel(b.Context())
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- p.Run(ctx) }()

		// Per trust domain: the attempt last seen and the schedule then in force.
		lastAttempt := make([]time.Time, len(eps))
		scheduled := make([]time.Time, len(eps))
		for i := range scheduled {
			scheduled[i] = start // Run schedules every first poll at once
		}
		tick := time.NewTicker(sample)
		deadline := time.After(runFor)
	observe:
		for {
			select {
			case <-deadline:
				break observe
			case <-tick.C:
			}
			for _, st := range p.Status() {
				i := index[st.TrustDomain]
				if st.LastAttempt != nil && !st.LastAttempt.Equal(lastAttempt[i]) {
					if !dead(i) {
						late = append(late, max(st.LastAttempt.Sub(scheduled[i]), 0))
						if st.ConsecutiveFailures > 0 {
							failed++
						}
					}
					lastAttempt[i] = *st.LastAttempt
				}
				if st.NextRefresh != nil {
					scheduled[i] = *st.NextRefresh
				}
			}
		}
		tick.Stop()
		cancel()
		require.NoError(b, <-done)
		for _, st := range p.Status() {
			if dead(index[st.TrustDomain]) {
				require.NotEqual(b, StateOK, st.State, "%s is blackholed", st.TrustDomain)
			}
		}
	}
	require.NotEmpty(b, late, "no healthy poll observed")
	slices.Sort(late)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(late[(len(late)*99-1)/100]), "p99-late-ms")
	b.ReportMetric(ms(late[len(late)/2]), "p50-late-ms")
	b.ReportMetric(float64(len(late))/float64(healthy), "polls/td")
	b.ReportMetric(100*float64(failed)/float64(len(late)), "healthy-failed-%")
}
