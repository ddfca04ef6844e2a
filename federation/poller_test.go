package federation

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// memSink records what the poller hands the trust store.
type memSink struct {
	mu  sync.Mutex
	got map[string]*spiffebundle.Bundle
	n   int
}

func (s *memSink) Set(source string, b *spiffebundle.Bundle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got == nil {
		s.got = map[string]*spiffebundle.Bundle{}
	}
	s.got[source] = b
	s.n++
}

func (s *memSink) Remove(source string, _ spiffeid.TrustDomain) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.got, source)
	s.n++
}

// X509BundleFor is what the poller wrote for td: the fetcher's roots.
func (s *memSink) X509BundleFor(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
	if b := s.get(SourceName(td)); b != nil {
		return b.X509Bundle(), true
	}
	return nil, false
}

func (s *memSink) get(source string) *spiffebundle.Bundle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[source]
}

// switchable serves whatever handler is current.
type switchable struct{ h atomic.Value }

func (s *switchable) set(h http.HandlerFunc) { s.h.Store(h) }
func (s *switchable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.h.Load().(http.HandlerFunc)(w, r)
}

type pollFixture struct {
	fx      *fetchFixture
	srv     *switchable
	ep      Endpoint
	pool    *x509.CertPool
	sink    *memSink
	reg     *prometheus.Registry
	dataDir string
	now     time.Time
	logger  *slog.Logger // nil discards
}

func newPollFixture(t *testing.T) *pollFixture {
	fx := newFetchFixture(t)
	sw := &switchable{}
	sw.set(serveDoc(fx.doc))
	srv := startTLS(t, sw, nil)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return &pollFixture{fx: fx, srv: sw, ep: web(t, fetchTD, srv.URL), pool: pool, sink: &memSink{},
		reg: prometheus.NewRegistry(), dataDir: t.TempDir(), now: time.Now()}
}

func (pf *pollFixture) poller(t *testing.T) *Poller {
	t.Helper()
	p, err := NewPoller(PollerConfig{
		Endpoints:  []Endpoint{pf.ep},
		Fetcher:    FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
		LKG:        NewLKGStore(pf.dataDir),
		Sink:       pf.sink,
		Registerer: pf.reg,
		Logger:     pf.logger,
		Now:        func() time.Time { return pf.now },
		Rand:       func() float64 { return 0.5 },
	})
	require.NoError(t, err)
	return p
}

func docWith(t *testing.T, b *spiffebundle.Bundle, seq uint64) []byte {
	t.Helper()
	c := b.Clone()
	c.SetSequenceNumber(seq)
	doc, err := bundledoc.Marshal(c)
	require.NoError(t, err)
	return doc
}

func TestPollerKeepsLastGoodThroughFailures(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	td := pf.ep.TrustDomain
	require.NoError(t, p.Refresh(t.Context(), td))
	require.True(t, pf.fx.bundle.Equal(pf.sink.get(SourceName(td))))
	st := p.Status()[0]
	assert.Equal(t, StateOK, st.State)
	assert.Equal(t, uint64(7), *st.Sequence)
	assert.Equal(t, int64(300), *st.RefreshHintSeconds)
	require.Len(t, st.Authorities, 1)
	assert.Equal(t, pf.now.Add(300*time.Second).UTC(), *st.NextRefresh, "the hint, with jitter centred")

	other := testca.New(t, fetchTD)
	cases := []struct {
		name    string
		handler http.HandlerFunc
		result  string
	}{
		{"HTTP 500 with a valid body", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write(pf.fx.doc)
		}, "status"},
		{"garbage", serveDoc([]byte("{nope")), "bundle"},
		{"sequence regression", serveDoc(docWith(t, pf.fx.bundle, 6)), "sequence_regression"},
		{"same sequence, other keys", serveDoc(docWith(t, other.Bundle(), 7)), "sequence_conflict"},
		{"keys: []", serveDoc([]byte(`{"keys":[],"spiffe_sequence":8}`)), "empty_bundle"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pf.srv.set(tc.handler)
			require.Error(t, p.Refresh(t.Context(), td))
			assert.True(t, pf.fx.bundle.Equal(pf.sink.get(SourceName(td))), "last good kept")
			st := p.Status()[0]
			assert.Equal(t, StateFailing, st.State)
			assert.NotEmpty(t, st.LastError)
			assert.Equal(t, i+1, st.ConsecutiveFailures)
			assert.Equal(t, uint64(7), *st.Sequence)
			assert.Equal(t, 1.0, testutil.ToFloat64(p.metrics.fetches.WithLabelValues(td.Name(), tc.result)))
		})
	}
	// Backoff after 5 failures: 16s, never the full interval.
	assert.Equal(t, pf.now.Add(16*time.Second).UTC(), *p.Status()[0].NextRefresh)

	// Recovery with a newer bundle.
	pf.srv.set(serveDoc(docWith(t, pf.fx.bundle, 8)))
	require.NoError(t, p.Refresh(t.Context(), td))
	st = p.Status()[0]
	assert.Equal(t, StateOK, st.State)
	assert.Equal(t, uint64(8), *st.Sequence)
	assert.Zero(t, st.ConsecutiveFailures)

	// Three refresh intervals without success: stale.
	pf.srv.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	pf.now = pf.now.Add(16 * time.Minute)
	require.Error(t, p.Refresh(t.Context(), td))
	assert.Equal(t, StateStale, p.Status()[0].State)
}

func TestPollerRestoresTrustBeforeAnyPoll(t *testing.T) {
	pf := newPollFixture(t)
	require.NoError(t, pf.poller(t).Refresh(t.Context(), pf.ep.TrustDomain))

	// A restart with the remote down: trust is back from disk at once.
	pf.srv.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	sink := &memSink{}
	pf.sink, pf.reg = sink, prometheus.NewRegistry()
	p := pf.poller(t)
	assert.Empty(t, p.LoadLastKnownGood())
	assert.True(t, pf.fx.bundle.Equal(sink.get(SourceName(pf.ep.TrustDomain))))
	require.Error(t, p.Refresh(t.Context(), pf.ep.TrustDomain))
	assert.True(t, pf.fx.bundle.Equal(sink.get(SourceName(pf.ep.TrustDomain))), "a failing remote never removes restored trust")
	assert.Equal(t, StateFailing, p.Status()[0].State)
}

func TestPollerRunPollsAtOnce(t *testing.T) {
	pf := newPollFixture(t)
	p, err := NewPoller(PollerConfig{
		Endpoints: []Endpoint{pf.ep},
		Fetcher:   FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
		Sink:      pf.sink,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	require.Eventually(t, func() bool { return pf.sink.get(SourceName(pf.ep.TrustDomain)) != nil }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

func TestNewPollerRefusesBadConfig(t *testing.T) {
	_, err := NewPoller(PollerConfig{})
	assert.ErrorContains(t, err, "needs a sink")
	ep := web(t, "a.org", "https://a.org/")
	_, err = NewPoller(PollerConfig{Sink: &memSink{}, Endpoints: []Endpoint{ep, ep}})
	assert.Error(t, err, "duplicate trust domains")
	p, err := NewPoller(PollerConfig{Sink: &memSink{}, Endpoints: []Endpoint{ep}})
	require.NoError(t, err)
	assert.ErrorContains(t, p.Refresh(t.Context(), web(t, "b.org", "https://b.org/").TrustDomain), `"b.org" is not federated`)
}

func TestPollerBundles(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	assert.Empty(t, p.Bundles(), "nothing held before the first fetch")
	require.NoError(t, p.Refresh(t.Context(), pf.ep.TrustDomain))
	require.Len(t, p.Bundles(), 1)
	assert.True(t, pf.fx.bundle.Equal(p.Bundles()[0]), "as the endpoint published it, sequence included")
}

func TestPollerRefreshWhilePolling(t *testing.T) {
	pf := newPollFixture(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	pf.srv.set(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		serveDoc(pf.fx.doc)(w, r)
	})
	p := pf.poller(t)
	done := make(chan error, 1)
	go func() { done <- p.Refresh(t.Context(), pf.ep.TrustDomain) }()
	<-entered
	err := p.Refresh(t.Context(), pf.ep.TrustDomain)
	assert.ErrorIs(t, err, ErrPollInProgress, "no claim of a refresh that did not happen")
	close(release)
	require.NoError(t, <-done)
}

func TestPollerRefreshOutlivesItsCaller(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the operator's request went away
	require.NoError(t, p.Refresh(ctx, pf.ep.TrustDomain))
	st := p.Status()[0]
	assert.Equal(t, StateOK, st.State, "an aborted request is not the endpoint's failure")
	assert.Zero(t, st.ConsecutiveFailures)
}
