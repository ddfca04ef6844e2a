package server

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/catest"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// stubHealth is a CA's health as a test sets it.
type stubHealth struct {
	checkErr error
	upstream *ca.UpstreamStatus // nil: not in upstream mode
}

func (h *stubHealth) CheckError() error { return h.checkErr }

func (h *stubHealth) Upstream() (ca.UpstreamStatus, bool) {
	if h.upstream == nil {
		return ca.UpstreamStatus{}, false
	}
	return *h.upstream, true
}

func observeHealth(t *auditTrail, h caHealth) {
	t.mu.Lock()
	entries := t.healthEntriesLocked(h, "region.example")
	t.mu.Unlock()
	for _, e := range entries {
		t.record(e)
	}
}

// An upstream outage and failing CA checks are written to the audit log
// when they start and when they end, with the error and the outage's
// start, once each however many retries fail in between.
func TestAuditTrailRecordsHealthTurns(t *testing.T) {
	trail, buf := newTestTrail(t)
	since := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	h := &stubHealth{upstream: &ca.UpstreamStatus{Name: "trustbridge corp.example"}}

	observeHealth(trail, h)
	assert.Empty(t, drain(t, buf), "a healthy CA writes nothing")

	h.upstream = &ca.UpstreamStatus{Name: "trustbridge corp.example", Failures: 1, FailingSince: since,
		LastError: "ca: upstream trustbridge corp.example: connection refused"}
	observeHealth(trail, h)
	got := drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "upstream_failed", got[0].Event)
	assert.Equal(t, "region.example", got[0].TrustDomain)
	assert.Equal(t, "replica-1", got[0].Actor)
	assert.Contains(t, got[0].Reason, "connection refused")
	assert.Contains(t, got[0].Reason, "retried with backoff")

	h.upstream.Failures, h.upstream.LastError = 7, "ca: upstream trustbridge corp.example: intermediate refused: not a CA certificate"
	observeHealth(trail, h)
	assert.Empty(t, drain(t, buf), "retries in the same outage write nothing")

	h.checkErr = errors.New("ca: no valid intermediate to sign with: not a CA certificate")
	observeHealth(trail, h)
	got = drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "ca_check_failed", got[0].Event)
	assert.Contains(t, got[0].Reason, "no valid intermediate")
	assert.Contains(t, got[0].Reason, "/readyz")

	observeHealth(trail, h)
	assert.Empty(t, drain(t, buf))

	h.checkErr = nil
	h.upstream = &ca.UpstreamStatus{Name: "trustbridge corp.example", LastSuccess: since.Add(time.Hour),
		LastError: "ca: upstream trustbridge corp.example: intermediate refused: not a CA certificate"}
	observeHealth(trail, h)
	got = drain(t, buf)
	require.Len(t, got, 2)
	assert.Equal(t, "ca_check_recovered", got[0].Event)
	assert.Contains(t, got[0].Reason, "no valid intermediate", "names what had failed")
	assert.Equal(t, "upstream_recovered", got[1].Event)
	assert.Contains(t, got[1].Reason, "failing since 2026-11-28T10:00:00Z")
	assert.Contains(t, got[1].Reason, "not a CA certificate")

	observeHealth(trail, h)
	assert.Empty(t, drain(t, buf))
}

// An outage that starts with a refusal says so: asking again does not
// mend it, and it is asked again at the longest backoff.
func TestAuditTrailRecordsUpstreamRefusal(t *testing.T) {
	trail, buf := newTestTrail(t)
	observeHealth(trail, &stubHealth{upstream: &ca.UpstreamStatus{Name: "trustbridge corp.example", Failures: 1, FailingSince: time.Now(), Refused: true,
		LastError: "ca: upstream trustbridge at corp.example:15012 refused spiffe://region.example/x: not in --downstream-allow"}})
	got := drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "upstream_failed", got[0].Event)
	assert.Equal(t, "upstream trustbridge corp.example: ca: upstream trustbridge at corp.example:15012 refused spiffe://region.example/x: not in --downstream-allow "+
		"(refused, which asking again does not mend: fix what it names; asked again every 5m; the CA signs with its current intermediate while it is valid, and with none signs nothing)", got[0].Reason)
}

// Outside upstream mode only the checks are followed: a key manager that
// refuses a new root is recorded once, and its recovery.
func TestAuditTrailRecordsKeyManagerRefusal(t *testing.T) {
	trail, buf := newTestTrail(t)
	h := &stubHealth{checkErr: errors.New("ca: new root key: pkcs11: CKR_DEVICE_ERROR")}
	observeHealth(trail, h)
	got := drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "ca_check_failed", got[0].Event)
	assert.Contains(t, got[0].Reason, "CKR_DEVICE_ERROR")
	h.checkErr = nil
	observeHealth(trail, h)
	got = drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "ca_check_recovered", got[0].Event)
}

// A follower writes nothing. When it takes the lead in a failure that
// began before (the server nudges the trail then), the failure is written
// first, and its recovery after; no recovery is written without it.
func TestAuditTrailHealthOnAFollower(t *testing.T) {
	trail, buf := newTestTrail(t)
	leading := false
	trail.leader = func() bool { return leading }
	failing := &stubHealth{checkErr: errors.New("boom"),
		upstream: &ca.UpstreamStatus{Name: "u", Failures: 1, FailingSince: time.Now(), LastError: "down"}}
	observeHealth(trail, failing)
	assert.Empty(t, drain(t, buf))

	leading = true
	observeHealth(trail, failing)
	var events []string
	for _, e := range drain(t, buf) {
		events = append(events, e.Event)
	}
	assert.Equal(t, []string{"ca_check_failed", "upstream_failed"}, events)

	// It loses the lead; the failure ends while it follows, and it leads
	// again: nothing to write.
	leading = false
	observeHealth(trail, failing)
	healthy := &stubHealth{upstream: &ca.UpstreamStatus{Name: "u", LastSuccess: time.Now()}}
	observeHealth(trail, healthy)
	leading = true
	observeHealth(trail, healthy)
	assert.Empty(t, drain(t, buf), "no recovery without its failure in this term")
}

// With a real upstream-mode Authority, an outage reaches the audit log
// through the CA's change notifications, as the server wires it
// (followCA): once when the upstream first fails, once when it answers
// again, beside the new intermediate's own entries.
func TestAuditTrailFollowsUpstreamOutage(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	up := catest.NewUpstream(t, clk, "corp.example")
	a, err := ca.New(ca.Config{
		TrustDomain: spiffeid.RequireTrustDomainFromString("region.example"), DataDir: t.TempDir(),
		RefreshHint: time.Minute, WorkloadTTL: time.Hour, MaxWorkloadTTL: 2 * time.Hour,
		Upstream: up, UpstreamTTL: 48 * time.Hour, Clock: clk, Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	trail, buf := newTestTrail(t)
	var mu sync.Mutex // buf is written by followCA's goroutine
	trail.log = audit.New(lockedWriter{&mu, buf})
	trail.baseline(a, &federationSetup{store: trust.NewStore()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	changes := a.Subscribe() // before any change, as the server does
	go func() {
		done <- followCA(ctx, a, changes, &federationSetup{store: trust.NewStore()}, trail, newCATaints())
	}()
	t.Cleanup(func() { cancel(); <-done })
	// waitEvents waits for followCA to have written want since the
	// last call, and returns those entries.
	waitEvents := func(want ...string) []audit.Entry {
		t.Helper()
		var got []audit.Entry
		events := func() []string {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, drain(t, buf)...)
			out := []string{}
			for _, e := range got {
				out = append(out, e.Event)
			}
			return out
		}
		if !assert.Eventually(t, func() bool { return slices.Equal(want, events()) }, 10*time.Second, 10*time.Millisecond) {
			require.Equal(t, want, events())
		}
		return got
	}
	waitEvents("baseline", "baseline") // the intermediate and the JWT key

	up.Fail(errors.New("connection refused"))
	clk.Step(25 * time.Hour)
	require.NoError(t, a.Reconcile(), "the intermediate keeps signing")
	got := waitEvents("upstream_failed")
	assert.Contains(t, got[0].Reason, "connection refused")

	clk.Step(time.Minute)
	require.NoError(t, a.Reconcile())
	up.Fail(nil)
	clk.Step(10 * time.Minute)
	require.NoError(t, a.Reconcile())
	got = waitEvents("root_retired", "root_activated", "upstream_recovered")
	assert.Contains(t, got[2].Reason, "connection refused")
}

// lockedWriter serializes writes to a buffer a test also reads.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// However long an error is, its entry is written: the text is cut well
// below the audit log's line limit.
func TestAuditTrailHealthReasonIsBounded(t *testing.T) {
	trail, buf := newTestTrail(t)
	long := strings.Repeat("ü", audit.MaxLineSize)
	observeHealth(trail, &stubHealth{checkErr: errors.New(long),
		upstream: &ca.UpstreamStatus{Name: "u", Failures: 1, FailingSince: time.Now(), LastError: long}})
	got := drain(t, buf)
	require.Len(t, got, 2)
	for _, e := range got {
		assert.Less(t, len(e.Reason), maxHealthReason+200, e.Event)
		assert.True(t, utf8.ValidString(e.Reason))
	}
}
