package ca

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// A retired plug-in root past its RemoveAfter, with syncs that keep
// failing: the loop retries after recheckInterval, not at once on every
// pass (its timer would be armed for a time already past, and spin).
func TestPluginRunFailingRemovalIsNotRetriedAtOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	fb := &failingBackend{memBackend: newMemBackend()}
	a := newPluginAuthority(t, clk, Config{Backend: fb})
	// A new CA in the directory retires the first root.
	writePluginDir(t, a.cfg.Plugin.dir, newPluginPKI(t, pluginPKIOptions{now: clk.Now()}).files(t, false))
	require.NoError(t, a.cfg.Plugin.Check())
	require.NoError(t, a.manager.syncPlugin())
	require.Len(t, a.Bundle().X509Authorities(), 2, "the retired root is still published")
	// Check left a change notification that the sync above already took
	// in; a loop that found it pending would sync once more at a moment
	// of its own, after the backend starts failing, and count an error
	// this test does not expect.
	select {
	case <-a.cfg.Plugin.changes():
	default:
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})

	waitArmed(t, clk, "the loop sleeps until its next check")
	fb.fail.Store(true)
	clk.Step(2*time.Hour + retireMargin + time.Second) // the retired root is due to leave
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 1.0, testutil.ToFloat64(a.metrics.reconcileErrors))
	}, 10*time.Second, 5*time.Millisecond)

	// Step re-fires every timer due by the new time synchronously, so the
	// error count read once the loop sleeps again is exact.
	waitArmed(t, clk, "the failed removal waits for its retry")
	clk.Step(time.Second)
	waitArmed(t, clk, "the loop sleeps")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.reconcileErrors), "not retried a second later")
	assert.Len(t, a.Bundle().X509Authorities(), 2, "the last good bundle is kept")
	assert.ErrorContains(t, a.Ready(), "injected commit failure")

	clk.Step(recheckInterval - time.Second)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 2.0, testutil.ToFloat64(a.metrics.reconcileErrors))
	}, 10*time.Second, 5*time.Millisecond, "retried after recheckInterval")

	fb.fail.Store(false)
	waitArmed(t, clk, "the loop sleeps until its retry")
	clk.Step(recheckInterval)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Len(c, a.Bundle().X509Authorities(), 1, "the retired root leaves once a sync succeeds")
		assert.NoError(c, a.Ready())
	}, 10*time.Second, 5*time.Millisecond)
}

func TestRetryBy(t *testing.T) {
	checked := t0.Add(-time.Minute)
	tests := []struct {
		name    string
		checked time.Time
		next    time.Time
		want    time.Time
	}{
		{"nothing planned", checked, time.Time{}, t0.Add(recheckInterval)},
		{"due before the check: it failed", checked, checked.Add(-time.Hour), t0.Add(recheckInterval)},
		{"due at the check: it failed", checked, checked, t0.Add(recheckInterval)},
		{"due since the check: now", checked, t0.Add(-time.Second), t0.Add(-time.Second)},
		{"no check yet: now", time.Time{}, t0.Add(-time.Hour), t0.Add(-time.Hour)},
		{"sooner than the recheck", checked, t0.Add(time.Second), t0.Add(time.Second)},
		{"later than the recheck", checked, t0.Add(time.Hour), t0.Add(recheckInterval)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, retryBy(t0, tt.checked, tt.next))
		})
	}
}
