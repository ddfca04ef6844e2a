package kubestore

import (
	"errors"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/ca/catest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestUpstreamIntermediateOnASecret: in upstream mode on a real Secret,
// only the leader asks the upstream; followers load the intermediate and
// sign with it; a failover moves the renewals to the new leader, and a
// restart reuses the stored intermediate instead of asking again.
func TestUpstreamIntermediateOnASecret(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clocktesting.NewFakeClock(t0)
	up := catest.NewUpstream(t, clk, "corp.example")
	start := func(l *flag) *ca.Authority {
		t.Helper()
		cfg := authorityConfig(clk, newStore(t, env.Client, ns, l), l)
		cfg.Upstream, cfg.UpstreamTTL = up, 48*time.Hour
		a, err := ca.New(cfg)
		require.NoError(t, err)
		return a
	}
	// signs checks that a signs leaves its bundle verifies, with the
	// intermediate named id.
	signs := func(a *ca.Authority, id string) {
		t.Helper()
		issued := catest.SignLeaf(t, a, spiffeid.RequireFromPath(td, "/w"), clk.Now())
		require.Len(t, issued.Chain, 3, "leaf, intermediate, upstream root")
		assert.Equal(t, id, activeID(t, a))
	}

	oneLeads, twoLeads := leaderFlag(false), leaderFlag(false)
	two := start(twoLeads)
	require.Error(t, two.Ready(), "a follower with no state is not ready")
	assert.Zero(t, up.Calls(), "a follower never asks the upstream")

	oneLeads.v.Store(true)
	one := start(oneLeads)
	require.NoError(t, one.Ready())
	assert.Equal(t, 1, up.Calls())
	first := one.Roots()[0]
	require.NotNil(t, first.Upstream)
	assert.Equal(t, []string{up.Root.Cert.SerialNumber.Text(16)}, serials(one), "the bundle holds the upstream root, not the intermediate")
	sec := secret(t, env.Client, ns)
	assert.Contains(t, sortedKeys(sec.Data), castate.RootCertKey(first.ID))

	require.NoError(t, two.Reconcile())
	require.NoError(t, two.Ready())
	assert.True(t, one.Bundle().Equal(two.Bundle()))
	signs(two, first.ID)
	st, ok := two.Upstream()
	require.True(t, ok)
	assert.Equal(t, first.Upstream.ObtainedAt, st.LastSuccess, "a follower reports the leader's last success from the state")

	// Renewal at half life: the leader asks, the follower loads.
	clk.Step(25 * time.Hour)
	require.NoError(t, two.Reconcile())
	assert.Equal(t, 1, up.Calls(), "the follower does not renew")
	require.NoError(t, one.Reconcile())
	assert.Equal(t, 2, up.Calls())
	require.NoError(t, two.Reconcile())
	second := activeID(t, one)
	assert.NotEqual(t, first.ID, second)
	signs(two, second)
	assert.True(t, one.Bundle().Equal(two.Bundle()))

	// Failover, with the upstream down at first: the new leader keeps
	// signing with the stored intermediate and retries; the old one no
	// longer asks.
	oneLeads.v.Store(false)
	twoLeads.v.Store(true)
	up.Fail(errors.New("connection refused"))
	clk.Step(25 * time.Hour)
	require.NoError(t, one.Reconcile())
	assert.Equal(t, 2, up.Calls(), "the old leader does not renew")
	require.NoError(t, two.Reconcile(), "the last good intermediate keeps signing")
	assert.Equal(t, 3, up.Calls())
	signs(two, second)
	st, _ = two.Upstream()
	assert.Contains(t, st.LastError, "connection refused")
	up.Fail(nil)
	clk.Step(time.Minute)
	require.NoError(t, two.Reconcile())
	assert.Equal(t, 4, up.Calls())
	third := activeID(t, two)
	assert.NotEqual(t, second, third)
	require.NoError(t, one.Reconcile())
	signs(one, third)

	// A restart of the leader reuses the stored intermediate.
	three := start(twoLeads)
	assert.Equal(t, 4, up.Calls(), "a restart does not ask again")
	signs(three, third)
}

func activeID(t *testing.T, a *ca.Authority) string {
	t.Helper()
	for _, r := range a.Roots() {
		if r.State == castate.StateActive {
			return r.ID
		}
	}
	t.Fatal("no active intermediate")
	return ""
}
