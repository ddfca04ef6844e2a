package ca

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
)

func upstreamConfig(t *testing.T, clk *clocktesting.FakeClock, u *fakeUpstream) Config {
	cfg := testConfig(t, clk)
	cfg.Upstream = u
	cfg.UpstreamTTL = 48 * time.Hour
	return cfg
}

// leafVerifies signs a workload leaf and checks it with go-spiffe against
// the published bundle.
func leafVerifies(t *testing.T, a *Authority) *Issued {
	t.Helper()
	id := spiffeid.RequireFromPath(tdExample, "/w")
	issued, err := a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	raw := make([][]byte, 0, len(issued.Chain))
	for _, c := range issued.Chain[:len(issued.Chain)-len(issued.Roots)] {
		raw = append(raw, c.Raw)
	}
	got, _, err := x509svid.ParseAndVerify(raw, x509bundle.FromX509Authorities(tdExample, a.Bundle().X509Authorities()),
		x509svid.WithTime(a.cfg.Clock.Now()))
	require.NoError(t, err)
	assert.Equal(t, id, got)
	return issued
}

func TestUpstreamBootstrapSignsAndPublishesRootsOnly(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	require.NoError(t, a.Ready())
	roots := a.Roots()
	require.Len(t, roots, 1)
	assert.Equal(t, castate.StateActive, roots[0].State)
	require.NotNil(t, roots[0].Upstream)
	assert.Equal(t, "fake upstream", roots[0].Upstream.Name)
	assert.Equal(t, []*x509.Certificate{u.root}, a.Bundle().X509Authorities(), "the bundle carries the upstream root only, never the intermediate")

	issued := leafVerifies(t, a)
	require.Len(t, issued.Chain, 4, "leaf, our intermediate, the upstream intermediate, the upstream root")
	assert.True(t, issued.Chain[1].Equal(roots[0].Cert))
	assert.True(t, issued.Chain[2].Equal(u.mid))
	assert.Equal(t, []*x509.Certificate{u.root}, issued.Roots)
	assert.False(t, issued.Leaf.NotAfter.After(roots[0].Cert.NotAfter), "no leaf outlives the intermediate")

	// A restart reuses the intermediate without asking again.
	cfg := upstreamConfig(t, clk, u)
	cfg.DataDir = a.cfg.DataDir
	b, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, 1, u.callCount())
	assert.True(t, b.Roots()[0].Cert.Equal(roots[0].Cert))
	leafVerifies(t, b)
}

func TestUpstreamRenewsAtHalfLife(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	first := a.Roots()[0]
	seq := a.Sequence()

	clk.Step(23 * time.Hour)
	require.NoError(t, a.Reconcile())
	assert.Equal(t, 1, u.callCount(), "not renewed before half its life")

	clk.Step(2 * time.Hour)
	require.NoError(t, a.Reconcile())
	assert.Equal(t, 2, u.callCount())
	roots := a.Roots()
	require.Len(t, roots, 2)
	assert.Equal(t, castate.StateRetired, roots[0].State)
	assert.Equal(t, first.ID, roots[0].ID)
	assert.Equal(t, castate.StateActive, roots[1].State, "an intermediate under an already published root signs at once")
	assert.Equal(t, seq, a.Sequence(), "the published roots did not change")
	leafVerifies(t, a)

	// The retired one leaves once every leaf it signed expired.
	clk.Step(a.cfg.MaxWorkloadTTL + 2*retireMargin)
	require.NoError(t, a.Reconcile())
	require.Len(t, a.Roots(), 1)
	assert.Equal(t, []*x509.Certificate{u.root}, a.Bundle().X509Authorities())
	assert.Equal(t, float64(a.Roots()[0].Cert.NotAfter.Unix()), testutil.ToFloat64(a.metrics.intermediateExpiry))
}

func TestUpstreamNewRootIsPublishedBeforeUse(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	oldRoot, seq := u.root, a.Sequence()

	clk.Step(25 * time.Hour)
	u.newRoot()
	require.NoError(t, a.Reconcile())
	roots := a.Roots()
	require.Len(t, roots, 2)
	assert.Equal(t, castate.StateActive, roots[0].State, "the old intermediate keeps signing")
	assert.Equal(t, castate.StatePrepared, roots[1].State)
	assert.ElementsMatch(t, []*x509.Certificate{oldRoot, u.root}, a.Bundle().X509Authorities(), "the new root is published first")
	assert.Greater(t, a.Sequence(), seq)
	issued := leafVerifies(t, a)
	assert.True(t, issued.Chain[1].Equal(roots[0].Cert))
	assert.Equal(t, 2, u.callCount())

	clk.Step(PublishLead*a.cfg.RefreshHint - time.Second)
	require.NoError(t, a.Reconcile())
	assert.Equal(t, castate.StatePrepared, a.Roots()[1].State, "not before PublishLead refresh hints")
	clk.Step(time.Second)
	require.NoError(t, a.Reconcile())
	roots = a.Roots()
	assert.Equal(t, castate.StateRetired, roots[0].State)
	assert.Equal(t, castate.StateActive, roots[1].State)
	issued = leafVerifies(t, a)
	assert.True(t, issued.Chain[1].Equal(roots[1].Cert), "the new intermediate signs")
	assert.ElementsMatch(t, []*x509.Certificate{oldRoot, u.root}, issued.Roots,
		"every published root, as in self-signed mode: the retired intermediate's leaves still verify")
	assert.Equal(t, 2, u.callCount(), "no new request while the prepared one waited")
}

func TestUpstreamFailuresKeepLastGoodIntermediate(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		fail    error
		result  string
		message string
	}{
		{fail: errUpstreamDown, result: "error", message: "connection refused"},
		{mode: "non-ca", result: "refused", message: "not a CA certificate"},
		{mode: "other-td", result: "refused", message: "may name only spiffe://example.org"},
		{mode: "bad-chain", result: "refused", message: "does not verify"},
		{mode: "wrong-key", result: "refused", message: "not for the key of our request"},
		{mode: "expired", result: "refused", message: "not valid now"},
		{mode: "no-roots", result: "refused", message: "no root"},
	} {
		t.Run(tc.result+"/"+tc.mode, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			u := newFakeUpstream(t, clk)
			var logs bytes.Buffer
			cfg := upstreamConfig(t, clk, u)
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			a, err := New(cfg)
			require.NoError(t, err)
			good := a.Roots()[0]
			seq := a.Sequence()

			u.set(tc.mode, tc.fail)
			clk.Step(25 * time.Hour)
			require.NoError(t, a.Reconcile(), "a failure is no error while the last good intermediate is valid")
			require.NoError(t, a.Ready())
			assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.upstreamRequests.WithLabelValues(tc.result)))
			st, ok := a.Upstream()
			require.True(t, ok)
			assert.Contains(t, st.LastError, tc.message)
			assert.Contains(t, st.LastError, "fake upstream", "the error names the upstream")
			require.Len(t, a.Roots(), 1)
			assert.Equal(t, good.ID, a.Roots()[0].ID)
			assert.Equal(t, seq, a.Sequence())
			leafVerifies(t, a)

			// Retries back off, and the outage is logged once.
			require.NoError(t, a.Reconcile())
			assert.Equal(t, 2, u.callCount(), "no retry before the backoff")
			clk.Step(upstreamBackoff(1, tc.result == "refused"))
			require.NoError(t, a.Reconcile())
			assert.Equal(t, 3, u.callCount())
			assert.Equal(t, 1, bytes.Count(logs.Bytes(), []byte("upstream authority request failed")), logs.String())

			// Once the last good one expired, Ready says why.
			clk.Step(24 * time.Hour)
			err = a.Reconcile()
			require.ErrorIs(t, err, errNoIntermediate)
			a.manager.recordCheck(err, "check")
			require.Error(t, a.Ready())
			assert.Contains(t, a.Ready().Error(), tc.message)

			// The upstream recovers: signing resumes.
			u.set("", nil)
			clk.Step(upstreamBackoffMax)
			require.NoError(t, a.Reconcile())
			a.manager.recordCheck(nil, "")
			require.NoError(t, a.Ready())
			leafVerifies(t, a)
		})
	}
}

func TestUpstreamUnreachableAtFirstStart(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	u.set("", errUpstreamDown)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err, "the server starts, not ready")
	require.ErrorContains(t, a.Ready(), "connection refused")
	assert.Empty(t, a.Bundle().X509Authorities())
	u.set("", nil)
	clk.Step(upstreamBackoff(1, false))
	a.manager.recordCheck(a.Reconcile(), "")
	require.NoError(t, a.Ready())
	leafVerifies(t, a)
}

func TestUpstreamFollowerLoadsLeaderIntermediate(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	be := newMemBackend()
	cfg := upstreamConfig(t, clk, u)
	cfg.Backend, cfg.DataDir = be, ""
	fcfg := cfg
	fcfg.Registerer = prometheus.NewRegistry()
	fcfg.Leader = castate.LeaderFunc(func() bool { return false })

	follower, err := New(fcfg)
	require.NoError(t, err)
	require.Error(t, follower.Ready(), "a follower with no state is not ready")
	assert.Equal(t, 0, u.callCount(), "a follower never asks the upstream")

	leader, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, follower.Reload())
	require.NoError(t, follower.Ready())
	assert.Equal(t, leader.Roots()[0].Cert, follower.Roots()[0].Cert)
	assert.Equal(t, leader.Bundle().X509Authorities(), follower.Bundle().X509Authorities())
	leafVerifies(t, follower)

	clk.Step(25 * time.Hour)
	require.NoError(t, follower.Reconcile())
	assert.Equal(t, 1, u.callCount(), "a follower never renews")
	require.NoError(t, leader.Reconcile())
	require.NoError(t, follower.Reconcile())
	require.Len(t, follower.Roots(), 2)
	assert.Equal(t, castate.StateActive, follower.Roots()[1].State)
	assert.Equal(t, 2, u.callCount())
}

func TestUpstreamRefusesStateOfAnotherMode(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	self := testConfig(t, clk)
	_, err := New(self)
	require.NoError(t, err)
	cfg := upstreamConfig(t, clk, newFakeUpstream(t, clk))
	cfg.DataDir = self.DataDir
	_, err = New(cfg)
	require.ErrorContains(t, err, "holds self-signed roots")

	up, err := New(upstreamConfig(t, clk, newFakeUpstream(t, clk)))
	require.NoError(t, err)
	self.DataDir, self.Registerer = up.cfg.DataDir, prometheus.NewRegistry()
	_, err = New(self)
	require.ErrorContains(t, err, "holds intermediates signed by upstream fake upstream")

	cfg.Plugin = &PluginWatcher{}
	_, err = New(cfg)
	require.ErrorContains(t, err, "cannot be combined")
}

func TestUpstreamRecordIsCheckedOnLoad(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	store := NewStore(a.cfg.DataDir)
	j, _, err := store.Load("")
	require.NoError(t, err)
	other := newFakeUpstream(t, clk)
	for name, mutate := range map[string]func(*castate.UpstreamRecord){
		"root that did not sign": func(r *castate.UpstreamRecord) { r.Roots = [][]byte{other.root.Raw} },
		"garbage":                func(r *castate.UpstreamRecord) { r.Chain = [][]byte{[]byte("x")} },
		"no roots":               func(r *castate.UpstreamRecord) { r.Roots = nil },
		"chain out of order":     func(r *castate.UpstreamRecord) { r.Chain = [][]byte{other.mid.Raw} },
		"too many": func(r *castate.UpstreamRecord) {
			r.Chain = append(r.Chain, r.Chain[0], r.Chain[0], r.Chain[0], r.Chain[0], r.Chain[0], r.Chain[0], r.Chain[0])
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad := j.Clone()
			rec := *bad.Roots[0].Upstream
			rec.Chain = append([][]byte(nil), rec.Chain...)
			mutate(&rec)
			bad.Roots[0].Upstream = &rec
			require.NoError(t, store.saveJournal(bad))
			_, _, err := store.Load("")
			require.ErrorIs(t, err, castate.ErrCorruptState)
		})
	}
	mixed := j.Clone()
	mixed.Roots = append(mixed.Roots, castate.RootRecord{ID: "ab", State: castate.StateRetired, CertSHA256: "00"})
	data, err := castate.EncodeJournal(mixed)
	require.NoError(t, err)
	_, err = castate.DecodeJournal(data, "")
	require.ErrorContains(t, err, "mixes 1 self-signed roots with 1 upstream-signed intermediates")
}

func TestUpstreamBackoff(t *testing.T) {
	for failures, want := range map[int]time.Duration{
		1: 5 * time.Second, 2: 10 * time.Second, 3: 20 * time.Second, 7: 5 * time.Minute, 100: 5 * time.Minute,
	} {
		assert.Equal(t, want, upstreamBackoff(failures, false), "after %d failures", failures)
		assert.Equal(t, 5*time.Minute, upstreamBackoff(failures, true), "after %d refusals", failures)
	}
}

// With a key manager, the intermediate's key is made there: the journal
// records its reference, the state holds no key, and a restart finds it.
func TestUpstreamIntermediateKeyInKeyManager(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	keys := newFakeKeys()
	cfg := upstreamConfig(t, clk, u)
	cfg.Keys = keys
	a, err := New(cfg)
	require.NoError(t, err)
	roots := a.Roots()
	require.Len(t, roots, 1)
	require.NotNil(t, roots[0].Upstream)
	require.NotEmpty(t, roots[0].KeyRef)
	assert.True(t, keys.has(roots[0].KeyRef))
	_, err = os.Stat(NewStore(cfg.DataDir).keyPath(roots[0].ID))
	assert.ErrorIs(t, err, fs.ErrNotExist, "no key file for a key in the manager")
	leafVerifies(t, a)

	again := upstreamConfig(t, clk, u)
	again.DataDir, again.Keys = cfg.DataDir, keys.restart()
	b, err := New(again)
	require.NoError(t, err)
	assert.Equal(t, 1, u.callCount())
	leafVerifies(t, b)
}

// Subscribers (the audit trail) hear when an upstream outage starts and
// ends and when scheduled checks start and cease to fail, though the
// bundle stays as it was; retries within an outage wake nobody.
func TestSubscribersHearHealthTurns(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	sub := a.Subscribe()
	woken := func() bool {
		select {
		case <-sub:
			return true
		default:
			return false
		}
	}
	first := a.Roots()[0].ID

	u.set("", errUpstreamDown)
	clk.Step(25 * time.Hour)
	require.NoError(t, a.Reconcile())
	assert.True(t, woken(), "an outage starts")
	st, _ := a.Upstream()
	assert.Equal(t, clk.Now(), st.FailingSince)
	since := st.FailingSince

	clk.Step(upstreamBackoff(1, false))
	require.NoError(t, a.Reconcile())
	assert.False(t, woken(), "a retry in the same outage")
	st, _ = a.Upstream()
	assert.Equal(t, 2, st.Failures)
	assert.Equal(t, since, st.FailingSince, "the outage's start stays")

	a.manager.recordCheck(errors.New("key manager refused"), "check")
	assert.True(t, woken(), "checks start to fail")
	require.ErrorContains(t, a.CheckError(), "key manager refused")
	a.manager.recordCheck(errors.New("key manager refused again"), "check")
	assert.False(t, woken(), "checks still fail")
	a.manager.recordCheck(nil, "")
	assert.True(t, woken(), "checks cease to fail")
	require.NoError(t, a.CheckError())

	u.set("", nil)
	clk.Step(upstreamBackoffMax)
	require.NoError(t, a.Reconcile())
	assert.True(t, woken(), "the outage ends (with a new intermediate)")
	st, _ = a.Upstream()
	assert.Zero(t, st.Failures)
	assert.True(t, st.FailingSince.IsZero())
	assert.NotEqual(t, first, a.Roots()[len(a.Roots())-1].ID)
}

// An upstream's error may quote whatever it said, untrusted and of any
// length: the text kept for /readyz, status, logs and the audit log is
// bounded, the error chain is not lost.
func TestUpstreamErrorTextIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	u.set("", fmt.Errorf("rpc error: code = PermissionDenied desc = %s: %w", strings.Repeat("é", 1<<19), errUpstreamDown))
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	st, _ := a.Upstream()
	assert.LessOrEqual(t, len(st.LastError), maxUpstreamErrorLen+32)
	assert.True(t, utf8.ValidString(st.LastError))
	assert.Contains(t, st.LastError, "more bytes)")
	require.Error(t, a.Ready())
	assert.LessOrEqual(t, len(a.Ready().Error()), maxUpstreamErrorLen+200)
	assert.ErrorIs(t, a.Ready(), errUpstreamDown, "the chain is kept")
}

// While the upstream fails and the intermediate still signs, the CA is
// ready with a warning that says since when, how often, why and until
// when it can sign; once it answers again the warning is gone.
func TestUpstreamFailureIsAWarning(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	require.NoError(t, a.Warning())
	notAfter := a.Roots()[0].Cert.NotAfter

	u.set("", errUpstreamDown)
	clk.Step(25 * time.Hour)
	since := clk.Now()
	require.NoError(t, a.Reconcile())
	require.NoError(t, a.Ready(), "still signing")
	w := a.Warning()
	require.Error(t, w)
	require.ErrorIs(t, w, errUpstreamDown)
	for _, want := range []string{"fake upstream", "failing since " + since.UTC().Format(time.RFC3339), "1 failed requests",
		"signs until " + notAfter.UTC().Format(time.RFC3339), "connection refused"} {
		assert.Contains(t, w.Error(), want)
	}

	u.set("", nil)
	clk.Step(upstreamBackoff(1, false))
	require.NoError(t, a.Reconcile())
	require.NoError(t, a.Warning())

	self, err := New(testConfig(t, clk))
	require.NoError(t, err)
	require.NoError(t, self.Warning(), "no warning outside upstream mode")
}

// A replica that loses the lead in an upstream outage hears of its end
// from the state: once the new leader stores an intermediate obtained
// after the outage began, the old one reports no outage, no warning, and
// its subscribers hear it.
func TestUpstreamOutageEndedByAnotherWriter(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	be := newMemBackend()
	var oneLeads atomic.Bool
	oneLeads.Store(true)
	cfg := upstreamConfig(t, clk, u)
	cfg.Backend, cfg.DataDir = be, ""
	cfg.Leader = castate.LeaderFunc(oneLeads.Load)
	one, err := New(cfg)
	require.NoError(t, err)
	tcfg := cfg
	tcfg.Registerer = prometheus.NewRegistry()
	tcfg.Leader = castate.LeaderFunc(func() bool { return !oneLeads.Load() })
	two, err := New(tcfg)
	require.NoError(t, err)
	sub := one.Subscribe()

	u.set("", errUpstreamDown)
	clk.Step(25 * time.Hour)
	require.NoError(t, one.Reconcile())
	st, _ := one.Upstream()
	require.Equal(t, 1, st.Failures)
	<-sub

	// Failover; the upstream answers the new leader.
	oneLeads.Store(false)
	u.set("", nil)
	clk.Step(time.Minute)
	require.NoError(t, two.Reconcile())
	require.NoError(t, one.Reconcile())
	st, _ = one.Upstream()
	assert.Zero(t, st.Failures, "the outage is over here too")
	assert.True(t, st.FailingSince.IsZero())
	assert.Equal(t, clk.Now(), st.LastSuccess)
	assert.Contains(t, st.LastError, "connection refused", "the last error stays for reference")
	require.NoError(t, one.Warning())
	select {
	case <-sub:
	default:
		t.Fatal("the outage's end reaches subscribers")
	}
}

// Error text that is not UTF-8 is made valid, cut or not.
func TestClipErrorMakesValidUTF8(t *testing.T) {
	short := clipError(errors.New("bad \xff byte"), 100)
	assert.Equal(t, "bad \uFFFD byte", short.Error())
	long := clipError(fmt.Errorf("%s: %w", strings.Repeat("\xfe", 300), errUpstreamDown), 100)
	assert.True(t, utf8.ValidString(long.Error()))
	assert.LessOrEqual(t, len(long.Error()), 100+32)
	assert.ErrorIs(t, long, errUpstreamDown)
	ok := errors.New("fine")
	assert.Same(t, ok, clipError(ok, 100), "valid short text is kept as is")
}
