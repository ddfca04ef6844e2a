package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
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

// countingIdentityService mints a token per MintJWTSVID for the
// impersonated identity, counting them.
type countingIdentityService struct {
	identityapi.UnimplementedIdentityServiceServer
	clk   *clocktesting.FakeClock
	mints atomic.Int32
}

func (s *countingIdentityService) MintJWTSVID(_ context.Context, req *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, error) {
	n := s.mints.Add(1)
	return &identityapi.MintJWTSVIDResponse{Token: fmt.Sprint("token-", n), SpiffeId: req.GetImpersonatedIdentity(),
		ExpiresAt: s.clk.Now().Add(time.Hour).Unix()}, nil
}

// A node agent's workload asking for a new audience per request is
// refused past its budget (ResourceExhausted, saying what to do, logged),
// while another workload of the node still gets its tokens, and cached
// tokens cost nothing; the budget refills with time.
func TestNodeJWTMinterLimitsEachWorkload(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	svc := &countingIdentityService{clk: clk}
	gs := grpc.NewServer()
	identityapi.RegisterIdentityServiceServer(gs, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	var logs testlog.Buffer
	m := newNodeJWTMinter(conn, clk, slog.New(slog.NewTextHandler(&logs, nil)))

	for i := range jwtMintBurst {
		_, err := m.MintJWTSVIDFor(t.Context(), webID, []string{fmt.Sprint("aud-", i)})
		require.NoError(t, err, "mint %d, within the burst", i)
	}
	_, err = m.MintJWTSVIDFor(t.Context(), webID, []string{"one-too-many"})
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.ErrorContains(t, err, webID.String()+" asked for more than 2 new JWT-SVIDs per second")
	assert.Contains(t, logs.String(), "more new JWT-SVIDs than its budget")
	assert.EqualValues(t, jwtMintBurst, svc.mints.Load(), "the excess never reached the server")

	_, err = m.MintJWTSVIDFor(t.Context(), webID, []string{"aud-0"})
	require.NoError(t, err, "a cached token costs nothing")
	_, err = m.MintJWTSVIDFor(t.Context(), apiID, []string{"one-too-many"})
	require.NoError(t, err, "another workload's budget is its own")

	clk.Step(time.Second / time.Duration(jwtMintRate))
	_, err = m.MintJWTSVIDFor(t.Context(), webID, []string{"one-too-many"})
	require.NoError(t, err, "refilled")

	// No ID, or a trust domain's, names no workload: refused before
	// the server, never the node's own token.
	before := svc.mints.Load()
	for _, id := range []spiffeid.ID{{}, webID.TrustDomain().ID()} {
		_, err = m.MintJWTSVIDFor(t.Context(), id, []string{"aud-0"})
		assert.ErrorContains(t, err, "is not a SPIFFE ID of a workload", "%q", id)
	}
	assert.Equal(t, before, svc.mints.Load())
}

// The budgets are bounded: full ones are forgotten first.
func TestMintLimitsBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := mintLimits{m: map[spiffeid.ID]*rate.Limiter{}}
	busy := spiffeid.RequireFromString("spiffe://a.test/busy")
	for range jwtMintBurst {
		require.True(t, l.allow(busy, now))
	}
	for i := range maxCachedJWTs + 10 {
		l.allow(spiffeid.RequireFromSegments(tdA, "w", fmt.Sprint(i)), now.Add(time.Hour))
	}
	assert.LessOrEqual(t, len(l.m), maxCachedJWTs)
}
