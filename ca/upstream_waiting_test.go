package ca

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/upstream"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// waitingAuthority is an upstream-mode Authority whose upstream fails
// with fail at its first start, logging at debug level into logs.
func waitingAuthority(t *testing.T, fail error) (*Authority, *fakeUpstream, *clocktesting.FakeClock, *testlog.Buffer) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	u.set("", fail)
	logs := &testlog.Buffer{}
	cfg := upstreamConfig(t, clk, u)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := New(cfg)
	require.NoError(t, err, "the CA starts without an intermediate")
	return a, u, clk, logs
}

// check runs one scheduled check as Run does.
func check(a *Authority) { a.manager.recordCheck(a.Reconcile(), "CA rotation check failed") }

// countLevel counts the records at level whose message starts with msg.
func countLevel(logs *testlog.Buffer, level, msg string) int {
	return strings.Count(logs.String(), "level="+level+` msg="`+msg)
}

// An upstream that is not up at the first start: the CA starts, signs
// nothing, says why and when it asks next, asks on the backoff's
// schedule, and once the upstream signs it signs, serves and is ready,
// without a restart.
func TestUpstreamWaitingAtFirstStart(t *testing.T) {
	a, u, clk, logs := waitingAuthority(t, errUpstreamDown)
	since := t0.UTC().Format(time.RFC3339)
	require.EqualError(t, a.Ready(), "upstream authority: waiting for the upstream to sign our intermediate: ca: upstream fake upstream: connection refused; 1 failed requests since "+since+"; next attempt in 5s")
	assert.Empty(t, a.Bundle().X509Authorities(), "nothing is published")
	st, ok := a.Upstream()
	require.True(t, ok)
	assert.Equal(t, UpstreamStatus{Name: "fake upstream", LastError: "ca: upstream fake upstream: connection refused", LastErrorAt: t0,
		Failures: 1, FailingSince: t0, NextAttempt: t0.Add(5 * time.Second)}, st)
	assert.Equal(t, t0.Add(5*time.Second), a.manager.nextCheck(clk.Now()), "the next check is the retry")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.upstreamRequests.WithLabelValues("error")))
	assert.Equal(t, 1.0, a.readinessGauge())

	// Serving certificates wait: handshakes fail with the reason.
	running := mustServingCert(t, a)
	lazy := mustServingCert(t, a)
	_, err := running.GetCertificate(nil)
	require.ErrorIs(t, err, ErrInvalidSigningMaterial)
	assert.ErrorContains(t, err, "ca: no serving certificate for "+servingID.String()+" yet: ca: invalid signing material: no intermediate yet; the upstream's last answer failed: ca: upstream fake upstream: connection refused")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- running.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	// Before the backoff ends, checks ask nothing and say so only at
	// debug level; Ready counts down.
	clk.Step(3 * time.Second)
	check(a)
	assert.Equal(t, 1, u.callCount(), "no request before the backoff ends")
	assert.Contains(t, a.Ready().Error(), "; next attempt in 2s")
	clk.Step(2 * time.Second)
	check(a)
	assert.Equal(t, 2, u.callCount())
	assert.Contains(t, a.Ready().Error(), "; 2 failed requests since "+since+"; next attempt in 10s")
	assert.Equal(t, t0.Add(15*time.Second), a.manager.nextCheck(clk.Now()))
	assert.Equal(t, 1, countLevel(logs, "WARN", "upstream authority request failed; the CA signs nothing and /readyz fails until the upstream signs an intermediate"), logs.String())
	assert.Equal(t, 1, countLevel(logs, "ERROR", ""), "one error when the CA could not start signing, none per retry: %s", logs.String())
	assert.Equal(t, 1, countLevel(logs, "DEBUG", "upstream authority request failed again"), logs.String())

	// The upstream comes up: the next attempt installs an intermediate.
	u.set("", nil)
	clk.Step(10 * time.Second)
	check(a)
	require.NoError(t, a.Ready())
	assert.Equal(t, 0.0, a.readinessGauge())
	st, _ = a.Upstream()
	assert.Zero(t, st.Failures)
	assert.Zero(t, st.NextAttempt)
	assert.Equal(t, clk.Now(), st.LastSuccess)
	assert.Equal(t, []string{"upstream authority answered again"}, grepMessages(logs, "level=INFO", "answered"))
	leafVerifies(t, a)

	// A handshake issues the certificate at once; Run issues its own on
	// the CA's change.
	cert, err := lazy.GetCertificate(nil)
	require.NoError(t, err)
	require.NotNil(t, cert)
	assert.Same(t, cert, mustGet(t, lazy), "issued once")
	assert.NoError(t, cert.Leaf.CheckSignatureFrom(a.Roots()[0].Cert), "signed by the new intermediate")
	require.Eventually(t, func() bool { return running.Leaf() != nil }, 10*time.Second, time.Millisecond,
		"Run issues the certificate once the CA can sign")
}

// A refusal is asked again at the longest backoff, counted and reported
// as one; when the refusal turns into an outage (or back), the warning
// says so again.
func TestUpstreamRefusalRetriesSlowly(t *testing.T) {
	denied := upstream.Refused(errors.New("permission denied: spiffe://example.org is not in --downstream-allow"))
	a, u, clk, logs := waitingAuthority(t, denied)
	since := t0.UTC().Format(time.RFC3339)
	require.EqualError(t, a.Ready(), "upstream authority: the upstream refused to sign our intermediate, and will until what this names is fixed: "+
		"ca: upstream fake upstream: permission denied: spiffe://example.org is not in --downstream-allow; 1 failed requests since "+since+"; next attempt in 5m0s")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.upstreamRequests.WithLabelValues("refused")))
	assert.Equal(t, 0.0, testutil.ToFloat64(a.metrics.upstreamRequests.WithLabelValues("error")))
	st, _ := a.Upstream()
	assert.True(t, st.Refused)
	assert.Equal(t, t0.Add(upstreamBackoffMax), st.NextAttempt)
	assert.Equal(t, 1, countLevel(logs, "WARN", "upstream authority request failed: refused, which asking again does not mend; fix what the error names (asked again every 5m0s)"), logs.String())

	clk.Step(upstreamBackoff(1, false))
	check(a)
	assert.Equal(t, 1, u.callCount(), "a refusal is not asked again within seconds")
	clk.Step(upstreamBackoffMax - upstreamBackoff(1, false))
	check(a)
	assert.Equal(t, 2, u.callCount())
	assert.Equal(t, 2.0, testutil.ToFloat64(a.metrics.upstreamRequests.WithLabelValues("refused")))
	assert.Equal(t, 1, countLevel(logs, "WARN", "upstream authority request failed"), "the same refusal again is no news: %s", logs.String())

	// Mended upstream-side, then unreachable: backoff from the outage's
	// count, a new warning, no longer a refusal.
	u.set("", errUpstreamDown)
	clk.Step(upstreamBackoffMax)
	check(a)
	st, _ = a.Upstream()
	assert.False(t, st.Refused)
	assert.Equal(t, 3, st.Failures)
	assert.Equal(t, clk.Now().Add(upstreamBackoff(3, false)), st.NextAttempt)
	assert.Contains(t, a.Ready().Error(), "upstream authority: waiting for the upstream to sign our intermediate: ca: upstream fake upstream: connection refused; 3 failed requests since "+since)
	assert.Equal(t, 2, countLevel(logs, "WARN", "upstream authority request failed"), logs.String())

	u.set("", nil)
	clk.Step(upstreamBackoff(3, false))
	check(a)
	require.NoError(t, a.Ready())
	leafVerifies(t, a)
}

// An upstream that names itself in its errors is not named twice.
func TestUpstreamErrorNamesUpstreamOnce(t *testing.T) {
	a, _, _, _ := waitingAuthority(t, errors.New("fake upstream: dial tcp 127.0.0.1:1: connection refused"))
	st, _ := a.Upstream()
	assert.Equal(t, "ca: fake upstream: dial tcp 127.0.0.1:1: connection refused", st.LastError)
}

// When the last intermediate expired during an outage, Ready says so.
func TestUpstreamWaitingAfterExpiry(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	notAfter := a.Roots()[0].Cert.NotAfter
	u.set("", errUpstreamDown)
	clk.SetTime(notAfter.Add(time.Second))
	check(a)
	assert.Contains(t, a.Ready().Error(), "upstream authority: waiting for the upstream to sign our intermediate (the last one expired at "+notAfter.UTC().Format(time.RFC3339)+"): ca: upstream fake upstream: connection refused")
}

func mustServingCert(t *testing.T, a *Authority) *ServingCert {
	t.Helper()
	sc, err := a.ServingCert(servingID, time.Hour)
	require.NoError(t, err)
	assert.Nil(t, sc.Leaf(), "no certificate while the CA cannot sign")
	return sc
}

func mustGet(t *testing.T, sc *ServingCert) any {
	t.Helper()
	c, err := sc.GetCertificate(nil)
	require.NoError(t, err)
	return c
}

// grepMessages lists the msg of the records on lines holding every part.
func grepMessages(logs *testlog.Buffer, parts ...string) []string {
	var out []string
	for _, line := range strings.Split(logs.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if i := strings.Index(line, `msg="`); ok && i >= 0 {
			rest := line[i+len(`msg="`):]
			out = append(out, rest[:strings.Index(rest, `"`)])
		}
	}
	return out
}
