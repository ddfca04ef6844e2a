// Package keyedrate keeps one token bucket (golang.org/x/time/rate) per
// key, a bounded number of them, for per-caller rate limits: the
// certificate service's per-identity signing limit and the per-address
// share of TokenReviews.
//
//	l := keyedrate.New(rate.Limit(5), 20, 10000)
//	if !l.Allow(peer, time.Now()) {
//		// refuse: over this caller's rate
//	}
package ratelimit

import (
	"container/list"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiters keeps one token bucket per key, at most max of them: the least
// recently used is forgotten when a new key needs room. A forgotten key
// starts again with a full bucket, the most it could have had after being
// idle that long anyway; an attacker cycling through more keys than max
// gets a burst per key, which is what that many callers could get. Safe
// for concurrent use.
type Keyed struct {
	limit rate.Limit
	burst int
	max   int

	mu    sync.Mutex
	byKey map[string]*list.Element // of *bucket
	lru   *list.List               // front: most recently used
}

type bucket struct {
	key string
	lim *rate.Limiter
}

// New returns Limiters of limit events a second with bursts of burst,
// remembering at most maxKeys keys (at least one).
func NewKeyed(limit rate.Limit, burst, maxKeys int) *Keyed {
	return &Keyed{limit: limit, burst: burst, max: max(maxKeys, 1), byKey: map[string]*list.Element{}, lru: list.New()}
}

// Allow takes one token from key's bucket at now, if there is one.
func (l *Keyed) Allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byKey[key]
	if ok {
		l.lru.MoveToFront(e)
	} else {
		for l.lru.Len() >= l.max {
			old := l.lru.Back()
			l.lru.Remove(old)
			delete(l.byKey, old.Value.(*bucket).key)
		}
		e = l.lru.PushFront(&bucket{key: key, lim: rate.NewLimiter(l.limit, l.burst)})
		l.byKey[key] = e
	}
	return e.Value.(*bucket).lim.AllowN(now, 1)
}

// Len is the number of keys remembered.
func (l *Keyed) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}
