package certservice

import (
	"container/list"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiters keeps one token bucket per caller key, at most max of them: the
// least recently used is forgotten when a new key needs room. A forgotten
// caller starts again with a full bucket, which is the most it could have
// had after being idle that long anyway, unless more than max callers are
// active at once; each of them has had to authenticate.
type limiters struct {
	limit rate.Limit
	burst int
	max   int

	mu    sync.Mutex
	byKey map[string]*list.Element // of *keyed
	lru   *list.List               // front: most recently used
}

type keyed struct {
	key string
	lim *rate.Limiter
}

func newLimiters(limit rate.Limit, burst, maxKeys int) *limiters {
	return &limiters{limit: limit, burst: burst, max: maxKeys, byKey: map[string]*list.Element{}, lru: list.New()}
}

// allow takes one token from key's bucket at now, if there is one.
func (l *limiters) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byKey[key]
	if ok {
		l.lru.MoveToFront(e)
	} else {
		for l.lru.Len() >= l.max {
			old := l.lru.Back()
			l.lru.Remove(old)
			delete(l.byKey, old.Value.(*keyed).key)
		}
		e = l.lru.PushFront(&keyed{key: key, lim: rate.NewLimiter(l.limit, l.burst)})
		l.byKey[key] = e
	}
	return e.Value.(*keyed).lim.AllowN(now, 1)
}

// len is the number of limiters kept.
func (l *limiters) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}
