package federation

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// eventLog collects a poller's events.
type eventLog struct {
	mu sync.Mutex
	ev []Event
	ch chan Event
}

func newEventLog() *eventLog { return &eventLog{ch: make(chan Event, 100)} }

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
	l.ch <- e
}

func (l *eventLog) next(t *testing.T) Event {
	t.Helper()
	select {
	case e := <-l.ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return Event{}
	}
}

// secondEndpoint serves another trust domain's bundle over https_web.
func secondEndpoint(t *testing.T, pf *pollFixture, td string) (Endpoint, *testca.CA, *switchable) {
	t.Helper()
	ca := testca.New(t, td)
	b := ca.Bundle()
	b.SetSequenceNumber(1)
	sw := &switchable{}
	sw.set(serveDoc(docWith(t, b, 1)))
	srv := startTLS(t, sw, nil)
	pf.pool.AddCert(srv.Certificate())
	return web(t, td, srv.URL), ca, sw
}

func (pf *pollFixture) pollerWith(t *testing.T, eps []Endpoint, events *eventLog) *Poller {
	t.Helper()
	p, err := NewPoller(PollerConfig{
		Endpoints:  eps,
		Fetcher:    FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
		LKG:        NewLKGStore(pf.dataDir),
		Sink:       pf.sink,
		Registerer: prometheus.NewRegistry(),
		Now:        func() time.Time { return pf.now },
		Rand:       func() float64 { return 0.5 },
		OnEvent:    events.add,
	})
	require.NoError(t, err)
	return p
}

func runPoller(t *testing.T, p *Poller) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func statusOf(p *Poller, td string) (Status, bool) {
	for _, s := range p.Status() {
		if s.TrustDomain == td {
			return s, true
		}
	}
	return Status{}, false
}

func TestSetEndpointsWhileRunning(t *testing.T) {
	pf := newPollFixture(t)
	events := newEventLog()
	// No endpoints at first: a poller for a CRD-only configuration.
	p := pf.pollerWith(t, nil, events)
	runPoller(t, p)
	assert.Empty(t, p.Status())

	// Added: polled at once, trusted, reported.
	second, _, _ := secondEndpoint(t, pf, "second.test")
	require.NoError(t, p.SetEndpoints([]Endpoint{pf.ep, second}))
	for range 2 {
		ev := events.next(t)
		assert.Equal(t, EventEndpointAdded, ev.Kind)
		assert.Nil(t, ev.NewSequence, "nothing held yet")
	}
	accepted := map[string]Event{}
	for range 2 {
		ev := events.next(t)
		require.Equal(t, EventBundleAccepted, ev.Kind)
		accepted[ev.TrustDomain.Name()] = ev
	}
	require.Contains(t, accepted, fetchTD)
	assert.Equal(t, uint64(7), *accepted[fetchTD].NewSequence)
	assert.Nil(t, accepted[fetchTD].OldSequence)
	assert.Len(t, accepted[fetchTD].Added, 1)
	assert.Equal(t, pf.ep.URL.String(), accepted[fetchTD].EndpointURL)
	require.NotNil(t, pf.sink.get(SourceName(second.TrustDomain)))
	require.Len(t, p.Status(), 2)

	// Changed: same trust domain, another URL. The bundle is kept and the
	// new URL polled at once.
	moved, _, movedSrv := secondEndpoint(t, pf, "second.test")
	movedSrv.set(serveDoc(docWith(t, pf.sink.get(SourceName(second.TrustDomain)), 2)))
	require.NoError(t, p.SetEndpoints([]Endpoint{pf.ep, moved}))
	ev := events.next(t)
	assert.Equal(t, EventEndpointChanged, ev.Kind)
	assert.Equal(t, "url", ev.Reason)
	assert.Equal(t, uint64(1), *ev.OldSequence)
	assert.Equal(t, uint64(1), *ev.NewSequence, "the held bundle is kept")
	ev = events.next(t)
	assert.Equal(t, EventBundleAccepted, ev.Kind)
	assert.Equal(t, uint64(2), *ev.NewSequence)
	st, ok := statusOf(p, "second.test")
	require.True(t, ok)
	assert.Equal(t, moved.URL.String(), st.EndpointURL)

	// Unchanged: nothing happens.
	require.NoError(t, p.SetEndpoints([]Endpoint{pf.ep, moved}))
	// Removed: no longer trusted, no longer polled, reported with what it
	// held.
	require.NoError(t, p.SetEndpoints([]Endpoint{pf.ep}))
	ev = events.next(t)
	assert.Equal(t, EventEndpointRemoved, ev.Kind)
	assert.Equal(t, "second.test", ev.TrustDomain.Name())
	assert.Equal(t, uint64(2), *ev.OldSequence)
	assert.Len(t, ev.Removed, 1)
	assert.Nil(t, pf.sink.get(SourceName(moved.TrustDomain)))
	_, ok = statusOf(p, "second.test")
	assert.False(t, ok)
	assert.ErrorContains(t, p.Refresh(t.Context(), moved.TrustDomain), "not federated")
	select {
	case ev := <-events.ch:
		t.Fatalf("unexpected event %+v", ev)
	default:
	}
}

func TestSetEndpointsIsAllOrNothing(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.pollerWith(t, []Endpoint{pf.ep}, newEventLog())
	dup := pf.ep
	err := p.SetEndpoints([]Endpoint{pf.ep, dup})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fetchTD)
	bad := pf.ep
	bad.Profile = "https_ftp"
	require.Error(t, p.SetEndpoints([]Endpoint{bad}))
	require.Len(t, p.Status(), 1, "the old set stands")
	assert.Equal(t, pf.ep.URL.String(), p.Status()[0].EndpointURL)
}

// An added trust domain starts from what was last trusted for it, and a
// removed one keeps its stored bundle for when it comes back.
func TestSetEndpointsRestoresLastKnownGood(t *testing.T) {
	pf := newPollFixture(t)
	events := newEventLog()
	p := pf.pollerWith(t, []Endpoint{pf.ep}, events)
	require.NoError(t, p.Refresh(t.Context(), pf.ep.TrustDomain))
	events.next(t) // accepted
	require.NoError(t, p.SetEndpoints(nil))
	assert.Equal(t, EventEndpointRemoved, events.next(t).Kind)
	assert.Nil(t, pf.sink.get(SourceName(pf.ep.TrustDomain)))

	pf.srv.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	require.NoError(t, p.SetEndpoints([]Endpoint{pf.ep}))
	ev := events.next(t)
	assert.Equal(t, EventEndpointAdded, ev.Kind)
	assert.Equal(t, uint64(7), *ev.NewSequence)
	assert.True(t, pf.fx.bundle.Equal(pf.sink.get(SourceName(pf.ep.TrustDomain))), "restored before any poll")
}

// A poll that was running when its endpoint changed must not apply what
// the old configuration fetched.
func TestSetEndpointsDiscardsPollOfOldConfig(t *testing.T) {
	pf := newPollFixture(t)
	events := newEventLog()
	p := pf.pollerWith(t, []Endpoint{pf.ep}, events)
	entered, release := make(chan struct{}), make(chan struct{})
	pf.srv.set(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		serveDoc(pf.fx.doc)(w, r)
	})
	errc := make(chan error, 1)
	go func() { errc <- p.Refresh(context.Background(), pf.ep.TrustDomain) }()
	<-entered
	moved, _, _ := secondEndpoint(t, pf, fetchTD)
	require.NoError(t, p.SetEndpoints([]Endpoint{moved}))
	assert.Equal(t, EventEndpointChanged, events.next(t).Kind)
	close(release)
	assert.ErrorContains(t, <-errc, "reconfigured or removed during the poll")
	assert.Nil(t, pf.sink.get(SourceName(pf.ep.TrustDomain)), "the old configuration's result was not applied")
	st := p.Status()[0]
	assert.Equal(t, StatePending, st.State)
	assert.Nil(t, st.LastAttempt)
}

func TestPollerEventsAndRefusals(t *testing.T) {
	pf := newPollFixture(t)
	events := newEventLog()
	p := pf.pollerWith(t, []Endpoint{pf.ep}, events)
	td := pf.ep.TrustDomain
	require.NoError(t, p.Refresh(t.Context(), td))
	assert.Equal(t, EventBundleAccepted, events.next(t).Kind)

	// Unchanged and failed fetches are no trust changes.
	require.NoError(t, p.Refresh(t.Context(), td))
	pf.srv.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	require.Error(t, p.Refresh(t.Context(), td))

	// A regression is refused and reported, with both sequences.
	pf.srv.set(serveDoc(docWith(t, pf.fx.bundle, 3)))
	require.Error(t, p.Refresh(t.Context(), td))
	ev := events.next(t)
	assert.Equal(t, EventBundleRejected, ev.Kind)
	assert.Equal(t, "sequence_regression", ev.Reason)
	assert.ErrorIs(t, ev.Err, ErrSequenceRegression)
	assert.Equal(t, uint64(7), *ev.OldSequence)
	assert.Equal(t, uint64(3), *ev.NewSequence)
	require.NoError(t, p.SetEndpoints([]Endpoint{pf.ep}))
	assert.Equal(t, map[string]uint64{"status": 1, "sequence_regression": 1}, p.Status()[0].Refusals)
	select {
	case ev := <-events.ch:
		t.Fatalf("unexpected event %+v", ev)
	default:
	}
}

func TestEndpointChanges(t *testing.T) {
	a := spiffe(t, fetchTD, "https://a.example/", fetchServerID)
	b := a
	assert.Empty(t, endpointChanges(a, b))
	b = spiffe(t, fetchTD, "https://b.example/", "spiffe://example.org/other")
	b.Refresh = Refresh{Min: time.Minute}
	assert.Equal(t, []string{"url", "endpoint_spiffe_id", "refresh"}, endpointChanges(a, b))
	c := web(t, fetchTD, "https://a.example/")
	c.BootstrapBundle = testca.New(t, fetchTD).Bundle()
	assert.Equal(t, []string{"profile", "endpoint_spiffe_id", "bootstrap_bundle"}, endpointChanges(a, c))
	d := c
	d.BootstrapBundle = testca.New(t, fetchTD).Bundle()
	assert.Equal(t, []string{"bootstrap_bundle"}, endpointChanges(c, d))
}
