package ca

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// failingBackend is a memBackend whose commits fail while fail is set.
type failingBackend struct {
	*memBackend
	fail atomic.Bool
}

func (f *failingBackend) Commit(base string, j *castate.Journal, roots []*castate.Root, jwtKeys []*castate.JWTKey) (string, error) {
	if f.fail.Load() {
		return "", errors.New("memory: injected commit failure")
	}
	return f.memBackend.Commit(base, j, roots, jwtKeys)
}

// newPluginAuthority makes a plug-in CA on clk whose directory watcher
// runs on a clock of its own that never moves, so that clk's only waiter
// is Run's timer.
func newPluginAuthority(t *testing.T, clk *clocktesting.FakeClock, cfg Config) *Authority {
	t.Helper()
	now := clk.Now()
	pluginDir := t.TempDir()
	writePluginDir(t, pluginDir, newPluginPKI(t, pluginPKIOptions{now: now}).files(t, true))
	cfg.TrustDomain, cfg.Clock, cfg.Registerer = tdExample, clk, prometheus.NewRegistry()
	cfg.RefreshHint, cfg.WorkloadTTL, cfg.MaxWorkloadTTL = time.Minute, time.Hour, 2*time.Hour
	cfg.JWTKeyTTL, cfg.MaxJWTSVIDTTL = 4*time.Hour, 30*time.Minute
	cfg.Plugin = NewPluginWatcher(pluginDir, tdExample, clocktesting.NewFakeClock(now), time.Second, nil)
	a, err := New(cfg)
	require.NoError(t, err)
	return a
}

// runPluginAuthority starts newPluginAuthority's CA.
func runPluginAuthority(t *testing.T, clk *clocktesting.FakeClock, cfg Config) *Authority {
	t.Helper()
	a := newPluginAuthority(t, clk, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return a
}

// waitArmed waits until the plug-in loop sleeps on its timer.
func waitArmed(t *testing.T, clk *clocktesting.FakeClock, msg string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.True(c, clk.HasWaiters())
	}, 10*time.Second, 5*time.Millisecond, msg)
}

// In plug-in mode a JWT key step that failed is retried within
// recheckInterval, not only at the next directory change.
func TestPluginRunRetriesFailedJWTStep(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	fb := &failingBackend{memBackend: newMemBackend()}
	a := runPluginAuthority(t, clk, Config{Backend: fb})
	waitArmed(t, clk, "the loop sleeps until its next check")
	fb.fail.Store(true)
	clk.Step(2 * time.Hour) // half the JWT key's life: its successor is due
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 1.0, testutil.ToFloat64(a.metrics.reconcileErrors))
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, "active", jwtStates(a), "the last good state is kept")
	assert.ErrorContains(t, a.Ready(), "injected commit failure")
	assert.Len(t, a.Bundle().JWTAuthorities(), 1)

	fb.fail.Store(false)
	waitArmed(t, clk, "a due step that failed is retried on a timer")
	clk.Step(recheckInterval)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, "active,prepared", jwtStates(a))
		// recordCheck clears the error just after the sync.
		assert.NoError(c, a.Ready())
	}, 10*time.Second, 5*time.Millisecond)
	assert.Len(t, a.Bundle().JWTAuthorities(), 2)
}

// `ca rotate --jwt` beside a running plug-in CA: the key is published
// within recheckInterval, not at the next JWT step days away.
func TestPluginRunPicksUpRequestedJWTKey(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	dataDir := t.TempDir()
	a := runPluginAuthority(t, clk, Config{DataDir: dataDir})
	waitArmed(t, clk, "the loop sleeps until its next check")
	kid, created, err := RequestJWTRotation(dataDir, clk.Now())
	require.NoError(t, err)
	require.True(t, created)
	clk.Step(recheckInterval)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, "active,prepared", jwtStates(a))
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, kid, a.JWTKeys()[1].KID)
	assert.Len(t, a.Bundle().JWTAuthorities(), 2)
}

func TestRecheckBy(t *testing.T) {
	tests := []struct {
		name string
		next time.Time
		want time.Time
	}{
		{"nothing planned", time.Time{}, t0.Add(recheckInterval)},
		{"sooner than the recheck", t0.Add(time.Second), t0.Add(time.Second)},
		{"later than the recheck", t0.Add(time.Hour), t0.Add(recheckInterval)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, recheckBy(t0, tt.next))
		})
	}
}

// A plug-in sync that fails to commit leaves the journal, keys and
// sequence last published in memory, and a JWT rotation asked for by the
// failed rotateJWTKey is not carried out later by a sync nobody asked for.
func TestPluginSyncFailureRollsBack(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	fb := &failingBackend{memBackend: newMemBackend()}
	a := newPluginAuthority(t, clk, Config{Backend: fb})
	seq, events := a.Sequence(), len(a.manager.journal.Events)

	fb.fail.Store(true)
	clk.Step(time.Minute)
	require.ErrorContains(t, a.manager.rotateJWTKey(), "injected commit failure")
	assert.Equal(t, seq, a.Sequence(), "the unsaved sequence is not reported")
	assert.Len(t, a.manager.journal.Events, events, "the unsaved events are dropped")
	assert.Equal(t, "active", jwtStates(a))
	assert.Len(t, a.Bundle().JWTAuthorities(), 1)
	published, _ := a.Bundle().SequenceNumber()
	assert.Equal(t, seq, published)

	fb.fail.Store(false)
	require.NoError(t, a.manager.syncPlugin())
	assert.Equal(t, "active", jwtStates(a), "the failed request left nothing pending")
	assert.Equal(t, seq, a.Sequence())
	require.NoError(t, a.manager.rotateJWTKey())
	assert.Equal(t, "active,prepared", jwtStates(a))
	assert.Greater(t, a.Sequence(), seq)
}

// New publishes the plug-in material it loads; no change signal is left
// for Run to publish it again at its first turn (which, under load, came
// after a test's injected failure and counted twice).
func TestPluginLoadLeavesNoChangePending(t *testing.T) {
	a := newPluginAuthority(t, clocktesting.NewFakeClock(time.Now()), Config{Backend: newMemBackend()})
	select {
	case <-a.cfg.Plugin.changes():
		t.Fatal("New's load left a change pending")
	default:
	}
	writePluginDir(t, a.cfg.Plugin.dir, newPluginPKI(t, pluginPKIOptions{now: time.Now()}).files(t, true))
	require.NoError(t, a.cfg.Plugin.Check())
	select {
	case <-a.cfg.Plugin.changes():
	default:
		t.Fatal("a later change is signalled")
	}
}
