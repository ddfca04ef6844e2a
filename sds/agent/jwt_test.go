package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestAudienceKey(t *testing.T) {
	assert.Equal(t, audienceKey([]string{"b", "a", "b"}), audienceKey([]string{"a", "b"}))
	assert.NotEqual(t, audienceKey([]string{"a,b"}), audienceKey([]string{"a", "b"}))
	assert.NotEqual(t, audienceKey([]string{"a\x00b"}), audienceKey([]string{"a", "b"}), "no separator an audience can hold")
	assert.NotEqual(t, audienceKey([]string{"1:a"}), audienceKey([]string{"a"}))
}

func TestJWTMinterCache(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clk := clocktesting.NewFakeClock(now)
	m := newJWTMinter("unused", nil, clk)
	m.store(audienceKey([]string{"x"}), cachedJWT{token: "t1", refreshAt: now.Add(time.Minute), expAt: now.Add(2 * time.Minute)}, now)
	tok, err := m.MintJWTSVID(context.Background(), []string{"x", "x"})
	require.NoError(t, err)
	assert.Equal(t, "t1", tok, "reused in the first half of its lifetime")

	t.Run("bounded", func(t *testing.T) {
		for i := range maxCachedJWTs + 10 {
			m.store(fmt.Sprint(i), cachedJWT{token: "t", refreshAt: now.Add(time.Minute), expAt: now.Add(2 * time.Minute)}, now)
		}
		assert.LessOrEqual(t, len(m.cache), maxCachedJWTs)
	})
	t.Run("expired entries go first", func(t *testing.T) {
		later := now.Add(3 * time.Minute)
		m.store("fresh", cachedJWT{token: "t", refreshAt: later.Add(time.Minute), expAt: later.Add(2 * time.Minute)}, later)
		assert.Len(t, m.cache, 1)
	})
}

// TestJWTMinterClosed: a FetchJWTSVID still running while the agent stops
// must not open a connection after close, which nothing would close.
func TestJWTMinterClosed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	m := newJWTMinter("127.0.0.1:1", func() *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS13} }, clk)
	m.close()
	_, err := m.MintJWTSVID(context.Background(), []string{"x"})
	require.ErrorIs(t, err, errMinterClosed)
	m.mu.Lock()
	defer m.mu.Unlock()
	assert.Nil(t, m.conn, "no connection opened after close")
}
