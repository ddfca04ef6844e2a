package loop

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: time.Second, Max: time.Minute}
	tests := []struct {
		failures int
		want     time.Duration
	}{
		{-3, time.Second},
		{0, time.Second},
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{6, 32 * time.Second},
		{7, time.Minute},
		{1 << 40, time.Minute},
		{math.MaxInt, time.Minute},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, b.Delay(tt.failures, 0.5), "failures %d", tt.failures)
	}
}

func TestBackoffJitterStaysInBounds(t *testing.T) {
	b := Backoff{Base: time.Second, Max: 10 * time.Second, Jitter: 0.2}
	assert.Equal(t, time.Second, b.Delay(1, 0), "the lower half of the jitter is clamped up to Base")
	assert.Equal(t, 1200*time.Millisecond, b.Delay(1, 1))
	assert.Equal(t, 3200*time.Millisecond, b.Delay(3, 0))
	assert.Equal(t, 4800*time.Millisecond, b.Delay(3, 1))
	assert.Equal(t, 10*time.Second, b.Delay(5, 1), "jitter never carries a delay past Max")
	for failures := 1; failures < 70; failures++ {
		for _, rnd := range []float64{0, 0.25, 0.5, 0.999, 1, -1, 2, math.NaN(), math.Inf(1)} {
			d := b.Delay(failures, rnd)
			assert.GreaterOrEqual(t, d, b.Base, "failures %d rnd %v", failures, rnd)
			assert.LessOrEqual(t, d, b.Max, "failures %d rnd %v", failures, rnd)
		}
	}
}

func TestBackoffMaxWinsOverBase(t *testing.T) {
	b := Backoff{Base: time.Minute, Max: time.Second, Jitter: 0.1}
	for _, failures := range []int{1, 2, 10} {
		assert.Equal(t, time.Second, b.Delay(failures, 0.9), "failures %d", failures)
	}
}

func TestJitter(t *testing.T) {
	tests := []struct {
		d    time.Duration
		frac float64
		rnd  float64
		want time.Duration
	}{
		{time.Minute, 0.15, 0.5, time.Minute},
		{time.Minute, 0.15, 0, 51 * time.Second},
		{time.Minute, 0.15, 1, 69 * time.Second},
		{time.Minute, 0.15, -5, 51 * time.Second},
		{time.Minute, 0.15, 5, 69 * time.Second},
		{time.Minute, 0.15, math.NaN(), time.Minute},
		{time.Minute, 0, 0.9, time.Minute},
		{time.Duration(math.MaxInt64), 0.5, 1, time.Duration(math.MaxInt64)},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, Jitter(tt.d, tt.frac, tt.rnd), "Jitter(%v, %v, %v)", tt.d, tt.frac, tt.rnd)
	}
}

func TestBackoffHugeMaxDoesNotOverflow(t *testing.T) {
	b := Backoff{Base: time.Second, Max: math.MaxInt64}
	prev := time.Duration(0)
	for failures := 1; failures < 100; failures++ {
		d := b.Delay(failures, 0.5)
		assert.GreaterOrEqual(t, d, prev, "failures %d: the delay must never shrink", failures)
		prev = d
	}
	assert.Equal(t, time.Duration(math.MaxInt64), b.Delay(64, 0.5))
}
