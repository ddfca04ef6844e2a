package bundleserver_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testclock "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var t0 = time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)

// fetchFrom requests target as a client at addr ("ip:port") would.
func fetchFrom(h http.Handler, method, target, addr string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = addr
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A peer polling over HTTPS on loopback is recorded with the sequence it
// was served; a 304 counts as served the current one, a HEAD not at all.
func TestFetchersRecordLoopbackClient(t *testing.T) {
	web := testca.New(t, "webpki.test")
	clk := testclock.NewFakeClock(t0)
	src := newSource(newBundle(t, td, 1, 1, time.Minute))
	s := newServer(t, bundleserver.Config{Local: src, GetCertificate: fixedCert(webCert(t, web)), Clock: clk})
	u := serve(t, s)
	c := client(t, pool(web.Cert), false)
	fetch := func(method, etag string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, u.String(), nil)
		require.NoError(t, err)
		req.Header.Set("User-Agent", "spire-server/1.11\t(café)") // what a Go client lets through
		if etag != "" {
			req.Header.Set("If-None-Match", etag)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp
	}
	want := bundleserver.Fetcher{TrustDomain: td, Client: "127.0.0.1", UserAgent: "spire-server/1.11(caf?)", LastFetch: t0, Sequence: 1, Fetches: 1}
	assert.Empty(t, s.Fetchers(td), "nobody has fetched yet")

	resp := fetch(http.MethodGet, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, []bundleserver.Fetcher{want}, s.Fetchers(td))

	clk.Step(time.Minute)
	etag := resp.Header.Get("ETag")
	require.Equal(t, http.StatusNotModified, fetch(http.MethodGet, etag).StatusCode)
	want.LastFetch, want.Fetches = t0.Add(time.Minute), 2
	assert.Equal(t, []bundleserver.Fetcher{want}, s.Fetchers(td), "a 304 is a fetch of the current sequence")

	src.Set(withRoot(t, src.Bundle()))
	require.NoError(t, s.Update())
	clk.Step(time.Minute)
	require.Equal(t, http.StatusOK, fetch(http.MethodGet, etag).StatusCode)
	want.LastFetch, want.Fetches, want.Sequence = t0.Add(2*time.Minute), 3, 2
	assert.Equal(t, []bundleserver.Fetcher{want}, s.Fetchers(td))

	clk.Step(time.Minute)
	require.Equal(t, http.StatusOK, fetch(http.MethodHead, "").StatusCode)
	assert.Equal(t, []bundleserver.Fetcher{want}, s.Fetchers(td), "a HEAD is served no keys")
}

// Only GETs answered with a bundle document are fetches: not refusals,
// not the OIDC issuer's documents.
func TestFetchersRecordOnlyBundleDocuments(t *testing.T) {
	src := newSource(nil)
	s := newServer(t, bundleserver.Config{Local: src,
		Issuers: []bundleserver.Issuer{{URL: issuerURL, TrustDomain: td, Source: src}}})
	h := s.Handler()
	const addr = "192.0.2.1:1234"
	assert.Equal(t, http.StatusServiceUnavailable, fetchFrom(h, http.MethodGet, "/", addr).Code)
	src.Set(withJWT(t, td, 1, newJWTKey(t, "kid-1")))
	require.NoError(t, s.Update())
	for _, tc := range []struct {
		method, target string
		code           int
	}{
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/nowhere", http.StatusNotFound},
		{http.MethodGet, "/bundles/west.example", http.StatusNotFound},
		{http.MethodHead, "/", http.StatusOK},
		{http.MethodGet, "/oidc" + bundleserver.DiscoveryPath, http.StatusOK},
		{http.MethodGet, "/oidc" + bundleserver.JWKSPath, http.StatusOK},
	} {
		assert.Equal(t, tc.code, fetchFrom(h, tc.method, tc.target, addr).Code, "%s %s", tc.method, tc.target)
	}
	assert.Empty(t, s.Fetchers(td))
	assert.Empty(t, s.Fetchers(westTD))

	// A RemoteAddr that is not host:port (Handler embedded behind a Unix
	// socket, say) is served and not recorded.
	assert.Equal(t, http.StatusOK, fetchFrom(h, http.MethodGet, "/", "@").Code)
	assert.Empty(t, s.Fetchers(td))
}

// Each trust domain's document has its own fetchers; the bundle map
// counts as a fetch of ours, and fetches of relayed documents cannot
// evict ours.
func TestFetchersPerTrustDomain(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := testclock.NewFakeClock(t0)
	east := newBundle(t, eastTD, 1, 7, 0)
	s := newServer(t, bundleserver.Config{Local: newSource(newBundle(t, td, 1, 3, 0)), ServeOthers: true, Registerer: reg, Clock: clk,
		Others: func() []*spiffebundle.Bundle { return []*spiffebundle.Bundle{east} }})
	h := s.Handler()
	for i, target := range []string{"/bundles/east.example", "/", "/bundle-map", "/bundles/example.org"} {
		require.Equal(t, http.StatusOK, fetchFrom(h, http.MethodGet, target, fmt.Sprintf("192.0.2.%d:1", i+1)).Code, target)
		clk.Step(time.Second)
	}
	ours := func(ip string, at int) bundleserver.Fetcher {
		return bundleserver.Fetcher{TrustDomain: td, Client: ip, LastFetch: t0.Add(time.Duration(at) * time.Second), Sequence: 3, Fetches: 1}
	}
	assert.Equal(t, []bundleserver.Fetcher{ours("192.0.2.4", 3), ours("192.0.2.3", 2), ours("192.0.2.2", 1)}, s.Fetchers(td))
	assert.Equal(t, []bundleserver.Fetcher{{TrustDomain: eastTD, Client: "192.0.2.1", LastFetch: t0, Sequence: 7, Fetches: 1}}, s.Fetchers(eastTD))
	assert.Empty(t, s.Fetchers(westTD), "never served")

	for i := range bundleserver.MaxRelayedFetchers + 5 {
		fetchFrom(h, http.MethodGet, "/bundles/east.example", fmt.Sprintf("[2001:db8::%x]:1", i))
	}
	assert.Len(t, s.Fetchers(eastTD), bundleserver.MaxRelayedFetchers)
	assert.Len(t, s.Fetchers(td), 3, "a flood of another trust domain's fetchers leaves ours")
	assert.InDelta(t, 6, evictions(t, reg, "relayed"), 0, "192.0.2.1 and the 5 over the bound")
	assert.InDelta(t, 0, evictions(t, reg, "local"), 0)
}

// The record holds MaxLocalFetchers clients and evicts the least recently
// seen, not the first seen.
func TestFetchersBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := testclock.NewFakeClock(t0)
	s := newServer(t, bundleserver.Config{Local: newSource(newBundle(t, td, 1, 1, 0)), Registerer: reg, Clock: clk})
	h := s.Handler()
	addr := func(i int) string { return fmt.Sprintf("10.0.%d.%d:443", i/256, i%256) }
	for i := range bundleserver.MaxLocalFetchers {
		fetchFrom(h, http.MethodGet, "/", addr(i))
		clk.Step(time.Second)
	}
	fetchFrom(h, http.MethodGet, "/", addr(0)) // the first seen is now the most recent
	clk.Step(time.Second)
	for i := range 3 {
		fetchFrom(h, http.MethodGet, "/", addr(bundleserver.MaxLocalFetchers+i))
		clk.Step(time.Second)
	}

	got := s.Fetchers(td)
	require.Len(t, got, bundleserver.MaxLocalFetchers)
	clients := map[string]uint64{}
	for i, f := range got {
		clients[f.Client] = f.Fetches
		if i > 0 {
			assert.False(t, f.LastFetch.After(got[i-1].LastFetch), "sorted by last fetch, most recent first")
		}
	}
	for i := 1; i <= 3; i++ {
		assert.NotContains(t, clients, fmt.Sprintf("10.0.0.%d", i), "least recently seen: evicted")
	}
	assert.Equal(t, uint64(2), clients["10.0.0.0"], "seen again: kept")
	assert.Equal(t, "10.0.1.2", got[0].Client)
	assert.InDelta(t, 3, evictions(t, reg, "local"), 0)

	// An evicted client that comes back starts again.
	fetchFrom(h, http.MethodGet, "/", addr(1))
	assert.Equal(t, uint64(1), s.Fetchers(td)[0].Fetches)
}

// evictions reads trustbridge_bundleserver_fetcher_evictions_total of
// record from reg.
func evictions(t *testing.T, reg *prometheus.Registry, record string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "trustbridge_bundleserver_fetcher_evictions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == record {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no evictions counter for %q", record)
	return 0
}

// Concurrent fetches, listings and updates: -race finds unsynchronised
// access; the counts find lost updates.
func TestFetchersConcurrent(t *testing.T) {
	const (
		workers  = 8
		clients  = 16 // per worker: 128 in all, under the bound
		requests = 200
	)
	src := newSource(newBundle(t, td, 1, 1, 0))
	s := newServer(t, bundleserver.Config{Local: src})
	h := s.Handler()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range requests {
				target := []string{"/", "/bundle-map", "/bundles/example.org"}[i%3]
				code := fetchFrom(h, http.MethodGet, target, fmt.Sprintf("198.51.100.%d:1", w*clients+i%clients)).Code
				if !assert.Equal(t, http.StatusOK, code) {
					return
				}
			}
		})
	}
	wg.Go(func() {
		b := src.Bundle()
		for range 20 {
			b = withRoot(t, b)
			src.Set(b)
			assert.NoError(t, s.Update())
			assert.LessOrEqual(t, len(s.Fetchers(td)), workers*clients)
		}
	})
	wg.Wait()
	got := s.Fetchers(td)
	assert.Len(t, got, workers*clients)
	var total uint64
	for _, f := range got {
		total += f.Fetches
	}
	// A map fetch racing an Update is not recorded (what it was served
	// is unknown), so a few may be missing; most are not.
	assert.LessOrEqual(t, total, uint64(workers*requests))
	assert.Greater(t, total, uint64(workers*requests*9/10))

	// Past the bound, concurrently: the record stays bounded.
	wg = sync.WaitGroup{}
	for w := range workers {
		wg.Go(func() {
			for i := range requests {
				fetchFrom(h, http.MethodGet, "/", fmt.Sprintf("[2001:db8::%x:%x]:1", w, i))
			}
		})
	}
	wg.Wait()
	assert.Len(t, s.Fetchers(td), bundleserver.MaxLocalFetchers)
}
