package ca

import (
	"context"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func testConfig(t *testing.T, clk *clocktesting.FakeClock) Config {
	return Config{
		TrustDomain:    tdExample,
		DataDir:        t.TempDir(),
		RootTTL:        24 * time.Hour,
		RefreshHint:    time.Minute,
		WorkloadTTL:    time.Hour,
		MaxWorkloadTTL: 2 * time.Hour,
		Clock:          clk,
		Registerer:     prometheus.NewRegistry(),
	}
}

func workloadCSR(t *testing.T, id spiffeid.ID) *x509.CertificateRequest {
	t.Helper()
	key := testca.NewKey(t, testca.ECP256)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id.URL()}}, key)
	require.NoError(t, err)
	csr, err := ParseCSR(der)
	require.NoError(t, err)
	return csr
}

func TestAuthorityBootstrapAndRestart(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, a.Ready())
	roots := a.Roots()
	require.Len(t, roots, 1)
	assert.Equal(t, castate.StateActive, roots[0].State)
	root := roots[0].Cert
	assert.Equal(t, []string{"spiffe://example.org"}, []string{root.URIs[0].String()})
	assert.Contains(t, root.Subject.String(), "O=example.org")
	assert.Contains(t, root.Subject.String(), root.SerialNumber.Text(16), "every root's subject is unique")
	assert.True(t, root.IsCA)
	assert.Equal(t, uint64(t0.Unix()), a.Sequence(), "the first sequence is the bootstrap time")
	select {
	case <-a.Subscribe():
	default:
		t.Fatal("the first bundle is announced")
	}

	// A restart a minute later cannot tell its state from a restored
	// copy: it publishes the same root with the restart time as sequence.
	clk.Step(time.Minute)
	cfg.Registerer = prometheus.NewRegistry()
	b, err := New(cfg)
	require.NoError(t, err)
	require.Len(t, b.Roots(), 1)
	assert.True(t, root.Equal(b.Roots()[0].Cert), "a restart reuses the root")
	assert.Equal(t, uint64(t0.Add(time.Minute).Unix()), b.Sequence(), "and publishes it under a new sequence")
	j, _, err := NewStore(cfg.DataDir).Load("")
	require.NoError(t, err)
	assert.Equal(t, b.Sequence(), j.Sequence, "the new sequence is persisted before it is published")

	// Restarted again in the same second: one more.
	cfg.Registerer = prometheus.NewRegistry()
	c, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, b.Sequence()+1, c.Sequence())
}

func TestAuthorityKeyTypes(t *testing.T) {
	for _, kt := range []KeyType{KeyECP256, KeyECP384, KeyRSA2048} {
		t.Run(string(kt), func(t *testing.T) {
			cfg := testConfig(t, clocktesting.NewFakeClock(t0))
			cfg.KeyType = kt
			a, err := New(cfg)
			require.NoError(t, err)
			_, err = a.Sign(workloadCSR(t, spiffeid.RequireFromPath(tdExample, "/w")), spiffeid.RequireFromPath(tdExample, "/w"), 0)
			require.NoError(t, err)
		})
	}
}

func TestAuthorityRefusesBadConfig(t *testing.T) {
	cfg := testConfig(t, clocktesting.NewFakeClock(t0))
	cfg.RootTTL = 3 * time.Hour
	_, err := New(cfg)
	assert.ErrorContains(t, err, "root TTL 3h0m0s is too short")

	cfg = testConfig(t, clocktesting.NewFakeClock(t0))
	cfg.WorkloadTTL = 3 * time.Hour
	_, err = New(cfg)
	assert.ErrorContains(t, err, "workload TTL 3h0m0s exceeds the maximum 2h0m0s")
}

// TestRotationProperty runs the CA on a fake clock through several
// rotations, issuing certificates all along. At every instant, every
// certificate issued so far that is still valid verifies against the
// bundle published at that instant; no root signs before it has been
// published for PublishLead refresh hints; and the sequence moves to
// nextSequence (one more, at least the time) whenever the published set of
// roots changes, and only then.
func TestRotationProperty(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)

	id := spiffeid.RequireFromPath(tdExample, "/workload")
	type issued struct {
		leaf *x509.Certificate
	}
	var certs []issued
	publishedAt := map[string]time.Time{} // root fingerprint → first seen in the bundle
	lastSet := ""
	lastSeq := a.Sequence()
	activations := 0
	seenActive := map[string]bool{}

	// Steps shorter than the 5-minute lead, and leaves at the maximum TTL,
	// so that a shortened lead or an early removal shows.
	for now := t0; now.Before(t0.Add(2 * 24 * time.Hour)); now = now.Add(3 * time.Minute) {
		clk.SetTime(now)
		require.NoError(t, a.Reconcile())

		bundle := a.Bundle()
		pool := x509.NewCertPool()
		var set []string
		for _, r := range bundle.X509Authorities() {
			fp := fingerprint(r)
			set = append(set, fp)
			pool.AddCert(r)
			if _, ok := publishedAt[fp]; !ok {
				publishedAt[fp] = now
			}
		}
		sort.Strings(set)
		seq, _ := bundle.SequenceNumber()
		if joined := strings.Join(set, ","); joined != lastSet {
			if lastSet != "" {
				assert.Equal(t, nextSequence(lastSeq, now), seq, "one published-set change, one sequence step (at %s)", now)
			}
			lastSet = joined
		} else {
			assert.Equal(t, lastSeq, seq, "no change, no sequence step (at %s)", now)
		}
		lastSeq = seq

		for _, r := range a.Roots() {
			if r.State == castate.StateActive && !seenActive[r.ID] {
				seenActive[r.ID] = true
				activations++
			}
		}

		res, err := a.Sign(workloadCSR(t, id), id, cfg.MaxWorkloadTTL)
		require.NoError(t, err)
		signer := res.Leaf.Issuer.String()
		for _, r := range a.Roots() {
			if r.Cert.Subject.String() == signer && activations > 1 {
				lead := now.Sub(publishedAt[fingerprint(r.Cert)])
				assert.GreaterOrEqual(t, lead, PublishLead*cfg.RefreshHint, "root %s signed %s after publication", r.ID, lead)
			}
		}
		certs = append(certs, issued{leaf: res.Leaf})

		for _, c := range certs {
			if now.After(c.leaf.NotAfter) {
				continue
			}
			_, err := c.leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			require.NoError(t, err, "certificate issued at %s no longer verifies at %s", c.leaf.NotBefore, now)
		}
	}
	assert.GreaterOrEqual(t, activations, 4, "bootstrap plus at least three rotations")
	assert.LessOrEqual(t, len(a.Roots()), 3, "retired roots leave the bundle")
}

func TestRestartMidRotation(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	clk.SetTime(t0.Add(12 * time.Hour))
	require.NoError(t, a.Reconcile())
	var prepared RootInfo
	for _, r := range a.Roots() {
		if r.State == castate.StatePrepared {
			prepared = r
		}
	}
	require.NotEmpty(t, prepared.ID, "a successor is prepared at half life")
	seq := a.Sequence()

	// A new process on the same data directory, two minutes later. While
	// no server ran, peers could not fetch the prepared root, so its
	// publication lead starts again at the restart.
	restart := t0.Add(12*time.Hour + 2*time.Minute)
	clk.SetTime(restart)
	cfg.Registerer = prometheus.NewRegistry()
	b, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, nextSequence(seq, restart), b.Sequence(), "the same published set, under a sequence past the restart")
	seq = b.Sequence()
	require.Len(t, b.Roots(), 2)
	rootState := func(id string) RootInfo {
		for _, r := range b.Roots() {
			if r.ID == id {
				return r
			}
		}
		t.Fatalf("root %s gone", id)
		return RootInfo{}
	}
	assert.Equal(t, castate.StatePrepared, rootState(prepared.ID).State)
	assert.Equal(t, restart, rootState(prepared.ID).PublishedAt)

	clk.SetTime(t0.Add(12*time.Hour + 5*time.Minute))
	require.NoError(t, b.Reconcile())
	assert.Equal(t, castate.StatePrepared, rootState(prepared.ID).State, "5 hints after the first publication is not enough after a restart")

	clk.SetTime(restart.Add(5 * time.Minute))
	require.NoError(t, b.Reconcile())
	for _, r := range b.Roots() {
		if r.ID == prepared.ID {
			assert.Equal(t, castate.StateActive, r.State, "the same timeline continues")
		} else {
			assert.Equal(t, castate.StateRetired, r.State)
			assert.Equal(t, clk.Now().Add(retireMargin+cfg.MaxWorkloadTTL), r.RemoveAfter)
		}
	}
	assert.Equal(t, seq, b.Sequence(), "activation does not change the published set")
}

func TestForcedRotate(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, a.Rotate())
	require.Len(t, a.Roots(), 2)
	assert.Equal(t, uint64(t0.Unix())+1, a.Sequence(), "bootstrapped and rotated in the same second: one step above the time")
	require.NoError(t, a.Rotate(), "a second request while one waits is a no-op")
	assert.Len(t, a.Roots(), 2)
}

// TestRequestRotation is `trustbridge ca rotate` against a running server:
// the CLI only appends a prepared root, with the server's settings; the
// server publishes it at its next check and counts the lead from then.
func TestRequestRotation(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	cfg.KeyType = KeyECP384
	a, err := New(cfg)
	require.NoError(t, err)

	clk.SetTime(t0.Add(time.Minute))
	id, created, err := RequestRotation(cfg.DataDir, clk.Now())
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := RequestRotation(cfg.DataDir, clk.Now())
	require.NoError(t, err)
	assert.False(t, created, "one waiting root is enough")
	assert.Equal(t, id, again)

	// The server has not looked yet: nothing published, nothing signs.
	assert.Len(t, a.Bundle().X509Authorities(), 1)

	picked := t0.Add(90 * time.Second)
	clk.SetTime(picked)
	require.NoError(t, a.Reconcile())
	require.Len(t, a.Bundle().X509Authorities(), 2, "published at the server's next check")
	for _, r := range a.Roots() {
		if r.ID == id {
			assert.Equal(t, castate.StatePrepared, r.State)
			assert.Equal(t, picked, r.PublishedAt)
			assert.Equal(t, "ECDSA", r.Cert.PublicKeyAlgorithm.String(), "created with the server's key type")
			assert.Equal(t, 384, r.Cert.PublicKey.(interface{ Params() *elliptic.CurveParams }).Params().BitSize)
		}
	}
	clk.SetTime(picked.Add(5*cfg.RefreshHint - time.Second))
	require.NoError(t, a.Reconcile())
	for _, r := range a.Roots() {
		if r.ID == id {
			assert.Equal(t, castate.StatePrepared, r.State, "not before 5 hints after the server published it")
		}
	}
	clk.SetTime(picked.Add(5 * cfg.RefreshHint))
	require.NoError(t, a.Reconcile())
	for _, r := range a.Roots() {
		if r.ID == id {
			assert.Equal(t, castate.StateActive, r.State)
		}
	}

	_, _, err = RequestRotation(t.TempDir(), clk.Now())
	assert.ErrorContains(t, err, "no CA state")
}

func TestSaveFailureLeavesNothingHalfDone(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	before := a.Bundle()

	a.manager.store.saveErr = errors.New("no space left on device")
	// Two failed checks: one would prepare a root, the next activate it.
	clk.SetTime(t0.Add(12 * time.Hour))
	require.ErrorContains(t, a.Reconcile(), "no space left on device")
	clk.SetTime(t0.Add(12*time.Hour + 10*time.Minute))
	require.Error(t, a.Reconcile())
	assert.True(t, before.Equal(a.Bundle()), "nothing published")
	for _, r := range a.Roots() {
		assert.Equal(t, castate.StateActive, r.State, "no root prepared or activated in memory only")
	}
	assert.Len(t, a.Roots(), 1)
	id := spiffeid.RequireFromPath(tdExample, "/w")
	res, err := a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	assert.Equal(t, before.X509Authorities()[0].Subject.String(), res.Leaf.Issuer.String(), "still signing with the published root")

	// Once the disk recovers, the timeline starts from a clean state.
	a.manager.store.saveErr = nil
	require.NoError(t, a.Reconcile())
	assert.Len(t, a.Bundle().X509Authorities(), 2, "the successor is published first")
	for _, r := range a.Roots() {
		if r.State == castate.StatePrepared {
			assert.Equal(t, clk.Now(), r.PublishedAt)
		}
	}
}

func TestStateRemovedUnderRunningServer(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, os.RemoveAll(NewStore(cfg.DataDir).Dir()))
	err = a.Reconcile()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "disappeared while the server was running")
	assert.Len(t, a.Roots(), 1, "the running CA keeps its roots")
}

func TestAuthorityRefusesCorruptDataDir(t *testing.T) {
	cfg := testConfig(t, clocktesting.NewFakeClock(t0))
	_, err := New(cfg)
	require.NoError(t, err)
	journal := NewStore(cfg.DataDir).journalPath()
	require.NoError(t, os.WriteFile(journal, []byte(`{"format":1,`), 0o600))
	cfg.Registerer = prometheus.NewRegistry()
	_, err = New(cfg)
	require.ErrorIs(t, err, castate.ErrCorruptState)
	data, _ := os.ReadFile(journal)
	assert.Equal(t, `{"format":1,`, string(data), "never overwritten")
}

func TestAuthorityMetrics(t *testing.T) {
	cfg := testConfig(t, clocktesting.NewFakeClock(t0))
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	a, err := New(cfg)
	require.NoError(t, err)
	id := spiffeid.RequireFromPath(tdExample, "/w")
	_, err = a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	other := spiffeid.RequireFromString("spiffe://other.org/w")
	_, err = a.Sign(workloadCSR(t, other), other, 0)
	require.Error(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.signings.WithLabelValues("ok")))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.signings.WithLabelValues("identity_not_allowed")))
	assert.Equal(t, float64(t0.Unix()), testutil.ToFloat64(a.metrics.sequence))
	n, err := testutil.GatherAndCount(reg, "trustbridge_ca_root_not_after_timestamp_seconds")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "trustbridge_ca_signing_duration_seconds" {
			assert.Equal(t, uint64(2), mf.GetMetric()[0].GetHistogram().GetSampleCount(), "refusals are timed too")
		}
	}
}

// TestRunActivatesOnTime runs the real schedule on synctest's fake time: a
// prepared root signs PublishLead hints after publication, not at the next
// 30s recheck, and not before.
func TestRunActivatesOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{
			TrustDomain: tdExample, DataDir: t.TempDir(), RootTTL: time.Hour,
			RefreshHint: time.Second, WorkloadTTL: time.Second, MaxWorkloadTTL: time.Second,
			Registerer: prometheus.NewRegistry(),
		}
		a, err := New(cfg)
		require.NoError(t, err)
		require.NoError(t, a.Rotate())
		published := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		active := func() int {
			n := 0
			for _, r := range a.Roots() {
				if r.State == castate.StateActive && r.ActivatedAt.After(r.PreparedAt) {
					n++
				}
			}
			return n
		}
		lead := PublishLead * cfg.RefreshHint
		time.Sleep(lead - time.Millisecond)
		synctest.Wait()
		assert.Zero(t, active(), "not active before %s", lead)
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 1, active(), "active %s after publication, not at the 30s recheck", lead)
		for _, r := range a.Roots() {
			if r.State == castate.StateActive && r.ActivatedAt.After(r.PreparedAt) {
				assert.Equal(t, published.Add(lead), r.ActivatedAt, "activated on the dot")
			}
		}
		cancel()
		require.NoError(t, <-done)
	})
}

// Activating a prepared root leaves the published bundle as it was, yet
// subscribers (the audit trail) must hear of it.
func TestSubscribeHearsStateChanges(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(testConfig(t, clk))
	require.NoError(t, err)
	require.NoError(t, a.Rotate())
	sub := a.Subscribe()
	newest := func() RootInfo { return a.Roots()[len(a.Roots())-1] }
	for range 1000 {
		select {
		case <-sub:
		default:
		}
		before := a.Bundle()
		clk.Step(time.Minute)
		require.NoError(t, a.Reconcile())
		if newest().State != castate.StateActive {
			continue
		}
		assert.True(t, before.Equal(a.Bundle()), "activation does not change the published bundle")
		select {
		case <-sub:
		default:
			t.Fatal("no signal for the activation")
		}
		return
	}
	t.Fatal("the prepared root never activated")
}
