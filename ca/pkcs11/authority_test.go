//go:build cgo

package pkcs11

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/ca/catest"
	"github.com/trustbridge/trustbridge/internal/testkit/hsmtest"
)

var td = spiffeid.RequireTrustDomainFromString("example.org")

func authorityConfig(clk *clocktesting.FakeClock, dir string, m *Manager) ca.Config {
	return ca.Config{
		TrustDomain: td, DataDir: dir, Keys: m, RequireHSM: true,
		RootTTL: 24 * time.Hour, RefreshHint: time.Minute, WorkloadTTL: time.Hour, MaxWorkloadTTL: 2 * time.Hour,
		Clock: clk, Registerer: prometheus.NewRegistry(),
	}
}

// signsLeaf has a sign a workload certificate its bundle verifies (the
// signature made in the token) and a JWT-SVID.
func signsLeaf(t *testing.T, a *ca.Authority, now time.Time) {
	t.Helper()
	id := spiffeid.RequireFromPath(td, "/w")
	catest.SignLeaf(t, a, id, now)
	_, _, err := a.SignJWT(id, []string{"aud"}, 0)
	require.NoError(t, err)
}

// inToken says whether m finds ref's key in the token.
func inToken(t *testing.T, m *Manager, ref string) bool {
	t.Helper()
	_, err := m.FindKey(context.Background(), ref)
	if err != nil {
		require.ErrorIs(t, err, ca.ErrKeyNotFound)
		return false
	}
	return true
}

// TestAuthorityLifecycleInSoftHSM: a CA whose keys live in a real
// SoftHSM2 token creates its root and JWT key there, signs with them,
// rotates (the successor made in the token, activated, the old root
// removed and its key destroyed in the token), and after a restart with
// a new session reuses the same token keys instead of making new ones.
func TestAuthorityLifecycleInSoftHSM(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	dir := t.TempDir()
	m := open(t, module, label, pin)
	a, err := ca.New(authorityConfig(clk, dir, m))
	require.NoError(t, err)
	require.NoError(t, a.Ready())
	first := a.Roots()[0]
	require.NotEmpty(t, first.KeyRef)
	assert.True(t, inToken(t, m, first.KeyRef))
	require.NotEmpty(t, a.JWTKeys()[0].KeyRef)
	signsLeaf(t, a, clk.Now())

	require.NoError(t, prepareRoot(a))
	next := a.Roots()[1]
	require.NotEmpty(t, next.KeyRef)
	assert.NotEqual(t, first.KeyRef, next.KeyRef)
	assert.True(t, inToken(t, m, next.KeyRef), "the successor is made in the token")
	for now := t0; inToken(t, m, first.KeyRef); now = now.Add(10 * time.Minute) {
		require.True(t, now.Before(t0.Add(3*24*time.Hour)), "the first root's key was never destroyed")
		clk.SetTime(now)
		require.NoError(t, a.Reconcile())
		signsLeaf(t, a, now)
	}
	var active ca.RootInfo
	for _, r := range a.Roots() {
		assert.NotEqual(t, first.ID, r.ID, "the removed root is gone")
		assert.True(t, inToken(t, m, r.KeyRef), "every published root keeps its key")
		if r.State == castate.StateActive {
			active = r
		}
	}
	require.NotEmpty(t, active.KeyRef)
	jwtRefs := map[string]bool{}
	for _, k := range a.JWTKeys() {
		jwtRefs[k.KeyRef] = true
	}
	require.NoError(t, m.Close())

	// A restart: a new session on the same token, the same state.
	m2 := open(t, module, label, pin)
	t.Cleanup(func() { _ = m2.Close() })
	b, err := ca.New(authorityConfig(clk, dir, m2))
	require.NoError(t, err)
	require.NoError(t, b.Ready())
	assert.Equal(t, len(a.Roots()), len(b.Roots()))
	for _, r := range b.Roots() {
		if r.State == castate.StateActive {
			assert.Equal(t, active.ID, r.ID)
			assert.Equal(t, active.KeyRef, r.KeyRef, "the same token key")
		}
	}
	for _, k := range b.JWTKeys() {
		assert.True(t, jwtRefs[k.KeyRef], "JWT key %s reused", k.KID)
	}
	signsLeaf(t, b, clk.Now())
}

// TestUpstreamIntermediateInSoftHSM: in upstream mode the intermediate's
// key is made in the token; a restart signs with it again, and a renewal
// makes its successor there too.
func TestUpstreamIntermediateInSoftHSM(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	dir := t.TempDir()
	up := catest.NewUpstream(t, clk, "corp.example")
	config := func(m *Manager) ca.Config {
		cfg := authorityConfig(clk, dir, m)
		cfg.Upstream, cfg.UpstreamTTL = up, 48*time.Hour
		return cfg
	}
	m := open(t, module, label, pin)
	a, err := ca.New(config(m))
	require.NoError(t, err)
	mid := a.Roots()[0]
	require.NotNil(t, mid.Upstream)
	require.NotEmpty(t, mid.KeyRef)
	assert.True(t, inToken(t, m, mid.KeyRef))
	signsLeaf(t, a, clk.Now())
	require.NoError(t, m.Close())

	m2 := open(t, module, label, pin)
	t.Cleanup(func() { _ = m2.Close() })
	b, err := ca.New(config(m2))
	require.NoError(t, err)
	assert.Equal(t, 1, up.Calls(), "a restart reuses the intermediate")
	signsLeaf(t, b, clk.Now())

	clk.Step(25 * time.Hour)
	require.NoError(t, b.Reconcile())
	assert.Equal(t, 2, up.Calls())
	var renewed ca.RootInfo
	for _, r := range b.Roots() {
		if r.State == castate.StateActive {
			renewed = r
		}
	}
	require.NotEqual(t, mid.ID, renewed.ID)
	assert.True(t, inToken(t, m2, renewed.KeyRef), "the successor's key is made in the token")
	signsLeaf(t, b, clk.Now())
}

// prepareRoot publishes a successor root now, as `ca authority prepare`
// does (a no-op while one waits).
func prepareRoot(a *ca.Authority) error {
	_, err := a.ChangeAuthority(ca.AuthorityChange{Action: "prepare"})
	return err
}
