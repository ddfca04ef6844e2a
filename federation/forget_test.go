package federation

import (
	"log/slog"
	"testing"

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
	st := p.states[td]
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
