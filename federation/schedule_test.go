package federation

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// justBelowOne is the largest rnd a [0, 1) generator returns.
var justBelowOne = math.Nextafter(1, 0)

func TestRefreshInterval(t *testing.T) {
	server := RefreshPolicy{Min: DefaultMinRefresh, Max: DefaultMaxRefresh}
	for _, tc := range []struct {
		name    string
		hint    time.Duration
		hasHint bool
		policy  RefreshPolicy
		want    time.Duration
	}{
		{"hint inside bounds", 2 * time.Minute, true, server, 2 * time.Minute},
		{"hint at min", 30 * time.Second, true, server, 30 * time.Second},
		{"hint at max", time.Hour, true, server, time.Hour},
		{"hint below min", 5 * time.Second, true, server, 30 * time.Second},
		{"hint above max", 24 * time.Hour, true, server, time.Hour},
		{"zero hint", 0, true, server, 30 * time.Second},
		{"negative hint", -time.Minute, true, server, 30 * time.Second},
		{"huge hint", math.MaxInt64, true, server, time.Hour},
		{"no hint", 0, false, server, DefaultRefresh},
		{"no hint ignores hint value", 10 * time.Second, false, server, DefaultRefresh},
		{"no hint clamped up", 0, false, RefreshPolicy{Min: 10 * time.Minute, Max: time.Hour}, 10 * time.Minute},
		{"no hint clamped down", 0, false, RefreshPolicy{Min: time.Second, Max: time.Minute}, time.Minute},
		{"zero policy keeps hint", 90 * time.Second, true, RefreshPolicy{}, 90 * time.Second},
		{"zero policy absolute floor", 0, true, RefreshPolicy{}, time.Second},
		{"zero policy absolute ceiling", math.MaxInt64, true, RefreshPolicy{}, 30 * 24 * time.Hour},
		{"only min", time.Second, true, RefreshPolicy{Min: time.Minute}, time.Minute},
		{"only max", 2 * time.Hour, true, RefreshPolicy{Max: time.Hour}, time.Hour},
		{"inverted policy: max wins", 0, false, RefreshPolicy{Min: time.Hour, Max: time.Minute}, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, RefreshInterval(tc.hint, tc.hasHint, tc.policy))
		})
	}
}

func TestRefreshPolicyFor(t *testing.T) {
	server := RefreshPolicy{Min: 30 * time.Second, Max: time.Hour}
	for _, tc := range []struct {
		name    string
		refresh Refresh
		want    RefreshPolicy
	}{
		{"no override", Refresh{}, server},
		{"min only", Refresh{Min: time.Minute}, RefreshPolicy{Min: time.Minute, Max: time.Hour}},
		{"max only", Refresh{Max: 10 * time.Minute}, RefreshPolicy{Min: 30 * time.Second, Max: 10 * time.Minute}},
		{"both", Refresh{Min: 5 * time.Second, Max: 2 * time.Hour}, RefreshPolicy{Min: 5 * time.Second, Max: 2 * time.Hour}},
		{"min above server max", Refresh{Min: 2 * time.Hour}, RefreshPolicy{Min: 2 * time.Hour, Max: 2 * time.Hour}},
		{"max below server min", Refresh{Max: 10 * time.Second}, RefreshPolicy{Min: 10 * time.Second, Max: 10 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := web(t, "example.org", "https://example.org/bundle")
			ep.Refresh = tc.refresh
			assert.Equal(t, tc.want, server.For(ep))
		})
	}
}

func TestNextRefresh(t *testing.T) {
	const interval = 5 * time.Minute
	for _, tc := range []struct {
		name     string
		interval time.Duration
		failures int
		rnd      float64
		want     time.Duration
	}{
		{"success no jitter", interval, 0, 0.5, interval},
		{"success lowest jitter", interval, 0, 0, 270 * time.Second},
		{"success negative failures", interval, -3, 0.5, interval},
		{"rnd below range clamped", interval, 0, -5, 270 * time.Second},
		{"rnd above range clamped", interval, 0, 7, 330 * time.Second},
		{"rnd NaN no jitter", interval, 0, math.NaN(), interval},
		{"failure 1", interval, 1, 0.5, time.Second},
		{"failure 2", interval, 2, 0.5, 2 * time.Second},
		{"failure 3", interval, 3, 0.5, 4 * time.Second},
		{"failure 4", interval, 4, 0.5, 8 * time.Second},
		{"failure 8", interval, 8, 0.5, 128 * time.Second},
		{"failure 9", interval, 9, 0.5, 256 * time.Second},
		{"failure 10 capped at interval", interval, 10, 0.5, interval},
		{"failure 10 capped, jitter only downwards", interval, 10, justBelowOne, interval},
		{"failure 10 capped, lowest jitter", interval, 10, 0, 270 * time.Second},
		{"failure 1 lowest jitter floored at 1s", interval, 1, 0, time.Second},
		{"failure 2 lowest jitter", interval, 2, 0, 1800 * time.Millisecond},
		{"failure 2 highest jitter", interval, 2, 1, 2200 * time.Millisecond},
		{"backoff equal to interval", 4 * time.Second, 3, 0.5, 4 * time.Second},
		{"huge failures", interval, math.MaxInt, 0.5, interval},
		{"failures at shift limit", interval, 63, 0.5, interval},
		{"failures past shift limit", interval, 64, 0.5, interval},
		{"failures 34 on max interval", math.MaxInt64, 34, 0.5, time.Second << 33},
		{"failures 35 on max interval", math.MaxInt64, 35, 0.5, math.MaxInt64},
		{"failures 64 on max interval", math.MaxInt64, 64, 0.5, math.MaxInt64},
		{"max interval success saturates", math.MaxInt64, 0, 1, math.MaxInt64},
		{"sub-second interval success", 200 * time.Millisecond, 0, 0, time.Second},
		{"sub-second interval failure", 200 * time.Millisecond, 1, 1, time.Second},
		{"sub-second interval many failures", 200 * time.Millisecond, 10, 0.5, time.Second},
		{"zero interval", 0, 0, 0.5, time.Second},
		{"negative interval", -time.Hour, 3, 0.5, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, NextRefresh(tc.interval, tc.failures, tc.rnd))
		})
	}
}

func TestNextRefreshJitterBounds(t *testing.T) {
	const interval = 10 * time.Minute
	lo, hi := 9*time.Minute, 11*time.Minute
	assert.Equal(t, lo, NextRefresh(interval, 0, 0))
	// In float64, 1+0.1*(2*rnd-1) rounds to exactly 1.1 for rnd this close
	// to 1, so the top of the range is reached, never passed.
	assert.Equal(t, hi, NextRefresh(interval, 0, justBelowOne))
	for i := range 1000 {
		rnd := float64(i) / 1000
		d := NextRefresh(interval, 0, rnd)
		assert.GreaterOrEqual(t, d, lo, "rnd=%v", rnd)
		assert.LessOrEqual(t, d, hi, "rnd=%v", rnd)
	}
}

// TestNextRefreshBackoffInvariants walks the failure counts a long outage
// produces: delays never shrink (without jitter), never drop under 1s and
// never exceed the interval, whatever the jitter.
func TestNextRefreshBackoffInvariants(t *testing.T) {
	for _, interval := range []time.Duration{0, 500 * time.Millisecond, time.Second, 3 * time.Second, 30 * time.Second, time.Hour, 30 * 24 * time.Hour, math.MaxInt64} {
		prev := time.Duration(0)
		for failures := 1; failures < 200; failures++ {
			d := NextRefresh(interval, failures, 0.5)
			assert.GreaterOrEqual(t, d, prev, "interval %v failures %d", interval, failures)
			prev = d
			for _, rnd := range []float64{0, 0.25, 0.75, justBelowOne} {
				d := NextRefresh(interval, failures, rnd)
				assert.GreaterOrEqual(t, d, MinRetry, "interval %v failures %d rnd %v", interval, failures, rnd)
				assert.LessOrEqual(t, d, max(interval, MinRetry), "interval %v failures %d rnd %v", interval, failures, rnd)
			}
		}
	}
}
