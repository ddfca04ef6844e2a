package certservice

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"golang.org/x/time/rate"
)

func TestLimitersBoundedLRU(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newLimiters(rate.Limit(1), 1, 3)
	for i := range 3 {
		assert.True(t, l.allow(fmt.Sprint(i), now))
	}
	assert.False(t, l.allow("0", now), "0's bucket is empty")
	// "1" is now the least recently used and is forgotten for "3".
	assert.True(t, l.allow("3", now))
	assert.Equal(t, 3, l.len())
	assert.False(t, l.allow("0", now), "0 was used recently and kept its empty bucket")
	assert.False(t, l.allow("2", now))
	assert.True(t, l.allow("1", now), "1 was forgotten and starts with a full bucket")
	assert.Equal(t, 3, l.len())
	assert.True(t, l.allow("0", now.Add(time.Second)), "refilled after a second")
}

func TestValidity(t *testing.T) {
	tests := []struct {
		seconds int64
		want    time.Duration
		refused bool
	}{
		{0, 0, false},
		{3600, time.Hour, false},
		{-1, 0, true},
		{1 << 62, time.Duration(1<<63 - 1), false},
	}
	for _, tt := range tests {
		got, ref := validity(tt.seconds)
		assert.Equal(t, tt.refused, ref != nil, "%d", tt.seconds)
		if ref == nil {
			assert.Equal(t, tt.want, got, "%d", tt.seconds)
		}
	}
}
