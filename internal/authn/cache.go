package authn

import (
	"container/list"
	"time"
)

// tokenKey is the SHA-256 of a token: the cache never holds token bytes.
type tokenKey [32]byte

// reviewCache is a bounded LRU of successful reviews. Not safe for
// concurrent use; TokenReview guards it.
type reviewCache struct {
	max     int
	order   *list.List // of *cacheEntry, most recently used first
	entries map[tokenKey]*list.Element
}

type cacheEntry struct {
	key     tokenKey
	ident   Identity
	expires time.Time
}

func newReviewCache(max int) *reviewCache {
	return &reviewCache{max: max, order: list.New(), entries: make(map[tokenKey]*list.Element)}
}

// get returns the cached identity for key if it has not expired at now.
func (c *reviewCache) get(key tokenKey, now time.Time) (Identity, bool) {
	el, ok := c.entries[key]
	if !ok {
		return Identity{}, false
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.expires) {
		c.remove(el)
		return Identity{}, false
	}
	c.order.MoveToFront(el)
	return e.ident, true
}

// put stores ident for key until expires, evicting the least recently used
// entry when full.
func (c *reviewCache) put(key tokenKey, ident Identity, expires time.Time) {
	if c.max <= 0 {
		return
	}
	if el, ok := c.entries[key]; ok {
		e := el.Value.(*cacheEntry)
		e.ident, e.expires = ident, expires
		c.order.MoveToFront(el)
		return
	}
	for c.order.Len() >= c.max {
		c.remove(c.order.Back())
	}
	c.entries[key] = c.order.PushFront(&cacheEntry{key: key, ident: ident, expires: expires})
}

func (c *reviewCache) remove(el *list.Element) {
	delete(c.entries, el.Value.(*cacheEntry).key)
	c.order.Remove(el)
}

func (c *reviewCache) len() int { return c.order.Len() }
