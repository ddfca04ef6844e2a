package loop

import (
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Backoff is the one retry schedule of trustbridge: federation polls, SDS
// re-authentication, the node agent's streams and renewals, and the
// upstream authority all wait Delay between failed attempts.
//
// The exponential part is apimachinery's wait.Backoff (factor 2, capped at
// Max). The jitter is applied here because wait.Backoff draws its own
// random number, and a schedule must stay a pure function that table tests
// can pin: the caller supplies rnd.
type Backoff struct {
	// Base is the delay before the first retry, and the least delay.
	Base time.Duration
	// Max caps every delay, jitter included. It wins over Base.
	Max time.Duration
	// Jitter moves each delay by up to ±Jitter of itself (0.1 = ±10%),
	// so that many clients failing together do not retry together.
	Jitter float64
}

// maxDoublings bounds the steps Delay takes: 2^64 of any base is past
// every cap.
const maxDoublings = 64

// Delay is the wait before retry number failures (1 for the first retry;
// 0 or less counts as 1): Base doubled per failure after the first, capped
// at Max, moved by the jitter (rnd in [0, 1), see Jitter) and clamped into
// [Base, Max].
func (b Backoff) Delay(failures int, rnd float64) time.Duration {
	steps := min(max(failures, 1), maxDoublings)
	wb := wait.Backoff{Duration: b.Base, Factor: 2, Cap: b.Max, Steps: steps}
	var d time.Duration
	for i := range steps {
		d = wb.Step()
		if i < steps-1 && wb.Duration < d {
			// The doubling overflowed time.Duration (or Base is over the
			// cap): every later step is past Max.
			d = b.Max
			break
		}
	}
	d = Jitter(d, b.Jitter, rnd)
	return min(max(d, b.Base), b.Max)
}

// Jitter is d moved by up to ±frac of itself: rnd 0 maps to -frac, 0.5 to
// d itself, values approaching 1 to +frac. rnd outside [0, 1] is clamped
// and NaN means no jitter, so a bad random source cannot stop a retry or
// make it tight. The result saturates instead of overflowing.
func Jitter(d time.Duration, frac, rnd float64) time.Duration {
	switch {
	case math.IsNaN(rnd):
		rnd = 0.5
	case rnd < 0:
		rnd = 0
	case rnd > 1:
		rnd = 1
	}
	v := float64(d) * (1 + frac*(2*rnd-1))
	switch {
	case v >= math.MaxInt64:
		return math.MaxInt64
	case v <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(v)
}
