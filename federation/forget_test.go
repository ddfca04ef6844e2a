package federation

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Forget deletes a removed trust domain's stored bundle, refuses one still
// followed, and a poll that ended before the removal does not write the
// bundle back afterwards (federation remove, then add with a new bundle,
// must not find the old roots).
func TestForget(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	td := pf.ep.TrustDomain
	store := NewLKGStore(pf.dataDir)
	require.NoError(t, p.Refresh(t.Context(), td))
	stored, err := store.Load(td)
	require.NoError(t, err)
	require.NotNil(t, stored, "the poll saved the bundle")

	assert.ErrorContains(t, p.Forget(td), "still federated")
	p.mu.Lock()
	st := p.rels[td]
	p.mu.Unlock()

	require.NoError(t, p.SetEndpoints(nil))
	require.NoError(t, p.Forget(td))
	stored, err = store.Load(td)
	require.NoError(t, err)
	assert.Nil(t, stored)

	// The save of a poll that ended just before the removal comes late.
	p.saveLKG(td, st, &LKGEntry{TrustDomain: td, Bundle: pf.fx.bundle, EndpointURL: pf.ep.URL.String()}, slog.New(slog.DiscardHandler))
	stored, err = store.Load(td)
	require.NoError(t, err)
	assert.Nil(t, stored, "a stale save does not bring a forgotten bundle back")
}

func TestForgetWithoutDeletion(t *testing.T) {
	pf := newPollFixture(t)
	p, err := NewPoller(PollerConfig{LKG: &memLKG{}, Sink: pf.sink})
	require.NoError(t, err)
	assert.ErrorIs(t, p.Forget(pf.ep.TrustDomain), ErrCannotForget)
}

// blockingRemoveLKG is a file store whose Remove waits for release.
type blockingRemoveLKG struct {
	*LKGStore
	entered, release chan struct{}
}

func (s blockingRemoveLKG) Remove(td spiffeid.TrustDomain) error {
	close(s.entered)
	<-s.release
	return s.LKGStore.Remove(td)
}

// A slow deletion of one trust domain's bundle does not hold up another
// trust domain's poll and save: the save locks are per trust domain.
func TestForgetDoesNotHoldUpOtherTrustDomains(t *testing.T) {
	pf := newPollFixture(t)
	store := blockingRemoveLKG{LKGStore: NewLKGStore(pf.dataDir), entered: make(chan struct{}), release: make(chan struct{})}
	p, err := NewPoller(PollerConfig{
		Endpoints: []Endpoint{pf.ep},
		Fetcher:   FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
		LKG:       store, Sink: pf.sink, Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	forgot := make(chan error, 1)
	go func() { forgot <- p.Forget(spiffeid.RequireTrustDomainFromString("gone.example")) }()
	<-store.entered

	polled := make(chan error, 1)
	go func() { polled <- p.Refresh(t.Context(), pf.ep.TrustDomain) }()
	select {
	case err := <-polled:
		require.NoError(t, err)
	case <-time.After(10 * time.Second): // a guard against a hang, not a measurement
		t.Fatal("a poll of another trust domain waited for Forget")
	}
	stored, err := store.Load(pf.ep.TrustDomain)
	require.NoError(t, err)
	assert.NotNil(t, stored, "saved while the other deletion waits")
	close(store.release)
	require.NoError(t, <-forgot)
}
