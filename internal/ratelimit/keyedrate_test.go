package ratelimit

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"golang.org/x/time/rate"
)

func TestBoundedLRU(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := NewKeyed(rate.Limit(1), 1, 3)
	for i := range 3 {
		assert.True(t, l.Allow(fmt.Sprint(i), now))
	}
	assert.False(t, l.Allow("0", now), "0's bucket is empty")
	// "1" is now the least recently used and is forgotten for "3".
	assert.True(t, l.Allow("3", now))
	assert.Equal(t, 3, l.Len())
	assert.False(t, l.Allow("0", now), "0 was used recently and kept its empty bucket")
	assert.False(t, l.Allow("2", now))
	assert.True(t, l.Allow("1", now), "1 was forgotten and starts with a full bucket")
	assert.Equal(t, 3, l.Len())
	assert.True(t, l.Allow("0", now.Add(time.Second)), "refilled after a second")
}

func TestAtLeastOneKey(t *testing.T) {
	l := NewKeyed(rate.Limit(1), 1, 0)
	assert.True(t, l.Allow("a", time.Unix(0, 0)))
	assert.Equal(t, 1, l.Len())
}
