package distribution

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// pacer spaces out writes to each namespace's ConfigMap: burst writes at
// once, then one per every. Two writers that undo each other's writes (two
// installations sharing a ConfigMap name, a webhook rewriting the data)
// would otherwise spin at the API server's speed, each write's watch event
// triggering the next; paced, the fight costs one write per namespace per
// every, and shows in trustbridge_distribution_throttled_total.
type pacer struct {
	every time.Duration
	burst int

	mu      sync.Mutex
	byNS    map[string]*rate.Limiter
	sweepAt int
}

// minSweep is the number of tracked namespaces below which idle ones are
// not swept out.
const minSweep = 64

func newPacer(burst int, every time.Duration) *pacer {
	return &pacer{every: every, burst: burst, byNS: map[string]*rate.Limiter{}, sweepAt: minSweep}
}

// wait returns how long ns must wait for its next write; 0 means now.
// Only writes that happened count (see wrote): failed attempts are spaced
// by the queue's backoff already, and an API server outage must not leave
// the namespaces waiting for the pacer once it is back.
func (p *pacer) wait(ns string, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.byNS[ns]
	if !ok {
		return 0
	}
	tokens := l.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) * float64(p.every))
}

// wrote takes one write from ns's allowance.
func (p *pacer) wrote(ns string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.byNS[ns]
	if !ok {
		if len(p.byNS) >= p.sweepAt {
			p.sweepLocked(now)
		}
		l = rate.NewLimiter(rate.Every(p.every), p.burst)
		p.byNS[ns] = l
	}
	// Past the allowance (a write wait did not see coming) the debt
	// carries over to the next wait.
	l.ReserveN(now, 1)
}

// sweepLocked forgets the namespaces whose allowance is full again: they
// are as if never written. It keeps memory bounded by the namespaces
// written recently, not every namespace ever written.
func (p *pacer) sweepLocked(now time.Time) {
	for ns, l := range p.byNS {
		if l.TokensAt(now) >= float64(p.burst) {
			delete(p.byNS, ns)
		}
	}
	p.sweepAt = max(minSweep, 2*len(p.byNS))
}

// throttledError postpones a write that the pacer refused.
type throttledError struct{ delay time.Duration }

func (e *throttledError) Error() string {
	return fmt.Sprintf("written too often, perhaps undone by another writer; next write in %s", e.delay.Round(time.Millisecond))
}
