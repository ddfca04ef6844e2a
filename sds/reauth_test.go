package sds

import (
	"crypto/x509"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/ratelimit"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

func (k *tokens) setUnavailable(v bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unavailable = v
}

func TestReauthRetryDelay(t *testing.T) {
	tests := []struct {
		failures int
		want     time.Duration
	}{
		{1, 5 * time.Second},
		{2, 10 * time.Second},
		{3, 20 * time.Second},
		{4, 40 * time.Second},
		{5, time.Minute},
		{50, time.Minute},
		{0, 5 * time.Second},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, reauthRetryDelay(tt.failures), "failures %d", tt.failures)
	}
}

func TestReauthGraceEnd(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	leaf := &x509.Certificate{NotAfter: since.Add(3 * time.Hour)}
	tests := []struct {
		name string
		cred *Credential
		want time.Time
	}{
		{"no credential: one interval", nil, since.Add(10 * time.Minute)},
		{"credential: its NotAfter", &Credential{Chain: []*x509.Certificate{leaf}}, leaf.NotAfter},
		{"empty chain: one interval", &Credential{}, since.Add(10 * time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, reauthGraceEnd(since, 10*time.Minute, tt.cred))
		})
	}
}

// stepUntilRetries steps the fake clock by d and waits until the stream
// has handled the timer: retries counted, and a new timer armed.
func (e *env) stepAndWaitRetries(d time.Duration, retries float64) {
	e.t.Helper()
	e.clock.Step(d)
	require.Eventually(e.t, func() bool {
		return testutil.ToFloat64(e.server.metrics.reauthRetries) == retries && e.clock.HasWaiters()
	}, 10*time.Second, time.Millisecond)
}

// While the authentication backend is unavailable (an attack on the
// TokenReview slots, an API server outage) a validation-only stream's
// re-authentication is retried with backoff and the stream kept; once
// the backend answers again, a revoked token still ends it.
func TestReauthUnavailableKeepsStream(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ReauthInterval = time.Minute })
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq("ROOTCA")))
	r := recv(t, s)
	require.NoError(t, s.Send(ack(r, "ROOTCA")))
	<-e.handled
	require.True(t, e.clock.HasWaiters())

	e.tokens.setUnavailable(true)
	e.stepAndWaitRetries(time.Minute, 1)
	e.stepAndWaitRetries(5*time.Second, 2)
	e.stepAndWaitRetries(10*time.Second, 3)
	assert.Zero(t, testutil.ToFloat64(e.server.metrics.authFails), "no refusal yet")

	// Back: the retry succeeds, the run of failures is over and the
	// normal interval applies again.
	e.tokens.setUnavailable(false)
	e.clock.Step(20 * time.Second)
	require.Eventually(t, e.clock.HasWaiters, 10*time.Second, time.Millisecond)

	e.tokens.revoke("token-a")
	e.clock.Step(time.Minute)
	_, err := s.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "a definitive refusal still ends the stream")
	assert.Equal(t, 3.0, testutil.ToFloat64(e.server.metrics.reauthRetries))
}

// A validation-only stream holds no certificate to bound its grace: it is
// kept for one ReauthInterval after the first failure, then ends with
// Unavailable so that the client reconnects and authenticates afresh.
func TestReauthUnavailableGraceEnds(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ReauthInterval = time.Minute })
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq("ROOTCA")))
	r := recv(t, s)
	require.NoError(t, s.Send(ack(r, "ROOTCA")))
	<-e.handled

	e.tokens.setUnavailable(true)
	// Failures at 0, +5s, +15s, +35s; the next retry is clamped to the
	// end of the grace, +60s.
	e.stepAndWaitRetries(time.Minute, 1)
	e.stepAndWaitRetries(5*time.Second, 2)
	e.stepAndWaitRetries(10*time.Second, 3)
	e.stepAndWaitRetries(20*time.Second, 4)
	e.clock.Step(25 * time.Second)
	_, err := s.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.authFails))
	assert.Equal(t, 4.0, testutil.ToFloat64(e.server.metrics.reauthRetries))
}

// A stream that holds a certificate keeps it (no new one is minted
// without authentication) through failures until it expires; a
// definitive refusal during the retries ends it at once.
func TestReauthUnavailableKeepsCredential(t *testing.T) {
	t.Run("until the certificate expires", func(t *testing.T) {
		e := newEnv(t)
		s := e.stream("token-a")
		require.NoError(t, s.Send(sotwReq("default")))
		r := recv(t, s)
		leaf := keyPair(t, secretsOf(t, r)["default"]).Leaf
		require.NotNil(t, leaf)
		require.NoError(t, s.Send(ack(r, "default")))
		<-e.handled
		signs := e.ca.signCount()

		e.tokens.setUnavailable(true)
		// The first re-authentication, then retries at most a minute
		// apart, past the refresh point, until the leaf's NotAfter.
		e.stepAndWaitRetries(DefaultReauthInterval, 1)
		retries := 1.0
		for e.clock.Now().Before(leaf.NotAfter.Add(-reauthRetry.Max)) {
			retries++
			e.stepAndWaitRetries(reauthRetry.Max, retries)
		}
		assert.Equal(t, signs, e.ca.signCount(), "no certificate minted without authentication")
		e.clock.SetTime(leaf.NotAfter)
		_, err := s.Recv()
		assert.Equal(t, codes.Unavailable, status.Code(err))
	})
	t.Run("a definitive refusal ends it", func(t *testing.T) {
		e := newEnv(t)
		s := e.stream("token-a")
		require.NoError(t, s.Send(sotwReq("default")))
		r := recv(t, s)
		require.NoError(t, s.Send(ack(r, "default")))
		<-e.handled
		e.tokens.setUnavailable(true)
		e.stepAndWaitRetries(DefaultReauthInterval, 1)
		e.tokens.setUnavailable(false)
		e.tokens.revoke("token-a")
		e.clock.Step(minRefreshDelay)
		_, err := s.Recv()
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
	})
}

// Streams refused because the authenticators are busy (a flood on the
// shared listener) log a bounded burst at Warn, never an Error per stream;
// the metric counts every one.
func TestUnavailableRefusalsAreNotErrors(t *testing.T) {
	logs := &testlog.Buffer{}
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	e.server.refuseLog = ratelimit.NewLogLimiter(0, 3)
	e.tokens.setUnavailable(true)
	const n = 20
	for range n {
		s := e.stream("token-a")
		// The server refuses the stream as it opens; a Send racing with
		// that sees io.EOF, and Recv has the status (grpc.ClientStream).
		if err := s.Send(sotwReq("ROOTCA")); err != nil {
			require.ErrorIs(t, err, io.EOF)
		}
		_, err := s.Recv()
		require.Equal(t, codes.Unavailable, status.Code(err))
	}
	assert.Equal(t, float64(n), testutil.ToFloat64(e.server.metrics.authFails))
	assert.Zero(t, strings.Count(logs.String(), `"level":"ERROR"`))
	assert.Equal(t, 3, strings.Count(logs.String(), `"level":"WARN","msg":"sds request refused"`))
	assert.Equal(t, n-3, strings.Count(logs.String(), `"level":"DEBUG","msg":"sds request refused"`))
}
