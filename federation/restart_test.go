package federation

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// After a restart with the peer down, the status shows when the stored
// bundle was fetched, and staleness is judged from that time, not from
// "never" (issue 21 item 6).
func TestPollerStatusAfterRestartShowsStoredLastSuccess(t *testing.T) {
	// The process stops; two minutes later a new one starts on the same
	// store while the peer is down.
	pf, fetched, p := restartWithPeerDown(t, 2*time.Minute)
	td := pf.ep.TrustDomain

	st := p.Status()[0]
	assert.Equal(t, StatePending, st.State, "not confirmed by the endpoint since the start")
	require.NotNil(t, st.LastSuccess, "the stored fetch time, not never")
	assert.Equal(t, fetched.UTC(), *st.LastSuccess)

	require.Error(t, p.Refresh(t.Context(), td))
	st = p.Status()[0]
	assert.Equal(t, StateFailing, st.State, "fetched 2m ago with a 5m hint: failing, not stale")
	assert.Equal(t, fetched.UTC(), *st.LastSuccess)
	assert.True(t, pf.fx.bundle.Equal(pf.sink.get(SourceName(td))), "restored trust kept")
	assert.NoError(t, testutil.GatherAndCompare(pf.reg, strings.NewReader(`
# HELP trustbridge_federation_bundle_age_seconds Seconds since the trust domain's bundle was last fetched successfully.
# TYPE trustbridge_federation_bundle_age_seconds gauge
trustbridge_federation_bundle_age_seconds{trust_domain="example.org"} 120
`), "trustbridge_federation_bundle_age_seconds"), "the age alert keeps counting across the restart")

	// Three refresh intervals after the stored fetch: stale, with the
	// same last success.
	pf.now = fetched.Add(16 * time.Minute)
	require.Error(t, p.Refresh(t.Context(), td))
	st = p.Status()[0]
	assert.Equal(t, StateStale, st.State)
	assert.Equal(t, fetched.UTC(), *st.LastSuccess)
	assert.Equal(t, 2, st.ConsecutiveFailures)
}

// A restart long after the last fetch is stale at the first failed poll,
// exactly as a process that had been running all along would be.
func TestPollerRestartOfOldStoreIsStale(t *testing.T) {
	pf, fetched, p := restartWithPeerDown(t, 24*time.Hour)
	require.Error(t, p.Refresh(t.Context(), pf.ep.TrustDomain))
	st := p.Status()[0]
	assert.Equal(t, StateStale, st.State)
	assert.Equal(t, fetched.UTC(), *st.LastSuccess)
}

// An unchanged bundle served again refreshes the stored fetch time, at
// most every half refresh interval, so a restart's last success is recent.
func TestPollerConfirmationRefreshesStoredFetchTime(t *testing.T) {
	pf := newPollFixture(t)
	td := pf.ep.TrustDomain
	store := NewLKGStore(pf.dataDir)
	p := pf.poller(t)
	first := pf.now
	require.NoError(t, p.Refresh(t.Context(), td))
	stored := func() time.Time {
		e, err := store.Load(td)
		require.NoError(t, err)
		require.NotNil(t, e)
		return e.FetchedAt
	}
	assert.True(t, first.Equal(stored()))

	pf.now = first.Add(time.Minute) // under half the 5m interval
	require.NoError(t, p.Refresh(t.Context(), td))
	assert.True(t, first.Equal(stored()), "not rewritten on every operator refresh")

	pf.now = first.Add(3 * time.Minute)
	require.NoError(t, p.Refresh(t.Context(), td))
	assert.True(t, pf.now.Equal(stored()), "the endpoint confirmed the bundle: the store says when")
}

func TestRestoredSuccess(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		fetchedAt time.Time
		want      time.Time
	}{
		{"unknown", time.Time{}, time.Time{}},
		{"past", now.Add(-time.Hour), now.Add(-time.Hour)},
		{"now", now, now},
		{"a little ahead: another replica's clock", now.Add(time.Minute), now},
		{"at the skew limit", now.Add(maxClockSkew), now},
		{"far ahead: claims nothing", now.Add(maxClockSkew + time.Second), time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, restoredSuccess(tt.fetchedAt, now))
		})
	}
}

// A stored entry whose fetch time lies far in the future restores the
// bundle but claims no success, so staleness is not hidden.
func TestPollerRestoreWithFutureFetchTime(t *testing.T) {
	pf := newPollFixture(t)
	td := pf.ep.TrustDomain
	require.NoError(t, NewLKGStore(pf.dataDir).Save(LKGEntry{TrustDomain: td, Bundle: pf.fx.bundle,
		EndpointURL: pf.ep.URL.String(), FetchedAt: pf.now.Add(365 * 24 * time.Hour)}))
	p := pf.poller(t)
	require.Empty(t, p.LoadLastKnownGood())
	st := p.Status()[0]
	assert.Nil(t, st.LastSuccess)
	assert.Equal(t, uint64(7), *st.Sequence, "the bundle itself is restored")
}

// restartWithPeerDown fetches once with a poller, then, after, starts a
// new poller (a new process) on the same last-known-good store with the
// endpoint answering 502, restored from the store.
func restartWithPeerDown(t *testing.T, after time.Duration) (pf *pollFixture, fetched time.Time, p *Poller) {
	t.Helper()
	pf = newPollFixture(t)
	fetched = pf.now
	require.NoError(t, pf.poller(t).Refresh(t.Context(), pf.ep.TrustDomain))
	pf.now = fetched.Add(after)
	pf.srv.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	pf.sink, pf.reg = &memSink{}, prometheus.NewRegistry()
	p = pf.poller(t)
	require.Empty(t, p.LoadLastKnownGood())
	return pf, fetched, p
}
