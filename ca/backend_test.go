package ca

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// memBackend keeps the CA state in memory, encoded as a Secret would hold
// it, with optimistic concurrency on a counter.
type memBackend struct {
	mu      sync.Mutex
	version int
	data    map[string][]byte
	// beforeCommit, when set, runs at the start of every Commit (outside
	// mu): another writer getting in first.
	beforeCommit func()
	commits      int
}

func newMemBackend() *memBackend { return &memBackend{} }

func (m *memBackend) Describe() string          { return "memory" }
func (m *memBackend) Lock(bool) (func(), error) { return func() {}, nil }
func (m *memBackend) versionLocked() string     { return versionString(m.version, m.data) }
func versionString(v int, data map[string][]byte) string {
	if data == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func (m *memBackend) Version() (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.versionLocked(), nil
}

func (m *memBackend) Load(td string) (*castate.Journal, []*castate.Root, []*castate.JWTKey, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.data == nil {
		return nil, nil, nil, "", nil
	}
	j, err := castate.DecodeJournal(m.data[castate.JournalKey], td)
	if err != nil {
		return nil, nil, nil, "", err
	}
	var roots []*castate.Root
	for _, rec := range j.Roots {
		r, err := castate.DecodeRoot(rec, m.data[castate.RootCertKey(rec.ID)], m.data[castate.RootKeyKey(rec.ID)])
		if err != nil {
			return nil, nil, nil, "", err
		}
		roots = append(roots, r)
	}
	var keys []*castate.JWTKey
	for _, rec := range j.JWTKeys {
		k, err := castate.DecodeJWTKey(rec, m.data[castate.JWTKeyKey(rec.KID)])
		if err != nil {
			return nil, nil, nil, "", err
		}
		keys = append(keys, k)
	}
	return j, roots, keys, m.versionLocked(), nil
}

func (m *memBackend) Commit(base string, j *castate.Journal, roots []*castate.Root, jwtKeys []*castate.JWTKey) (string, error) {
	if f := m.beforeCommit; f != nil {
		f()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if base != m.versionLocked() {
		return "", fmt.Errorf("memory: %w", castate.ErrConflict)
	}
	if err := checkCommit(j, roots, jwtKeys); err != nil {
		return "", err
	}
	data := map[string][]byte{}
	jb, err := castate.EncodeJournal(j)
	if err != nil {
		return "", err
	}
	data[castate.JournalKey] = jb
	for _, r := range roots {
		c, k, err := castate.EncodeRoot(r)
		if err != nil {
			return "", err
		}
		data[castate.RootCertKey(r.ID)], data[castate.RootKeyKey(r.ID)] = c, k
	}
	for _, k := range jwtKeys {
		pem, err := castate.EncodeJWTKey(k)
		if err != nil {
			return "", err
		}
		data[castate.JWTKeyKey(k.KID)] = pem
	}
	m.data = data
	m.version++
	m.commits++
	return m.versionLocked(), nil
}

func (m *memBackend) rootIDs(t *testing.T) []string {
	t.Helper()
	j, _, _, _, err := m.Load("")
	require.NoError(t, err)
	var ids []string
	for _, r := range j.Roots {
		ids = append(ids, r.ID)
	}
	return ids
}

// flag is a Leader tests switch.
type flag struct{ v atomic.Bool }

func (f *flag) IsLeader() bool { return f.v.Load() }
func leaderFlag(v bool) *flag {
	f := &flag{}
	f.v.Store(v)
	return f
}

func backendConfig(clk *clocktesting.FakeClock, b castate.Backend, l castate.Leader) Config {
	return Config{
		TrustDomain: tdExample, Backend: b, Leader: l,
		RootTTL: 24 * time.Hour, RefreshHint: time.Minute, WorkloadTTL: time.Hour, MaxWorkloadTTL: 2 * time.Hour,
		Clock: clk, Registerer: prometheus.NewRegistry(),
	}
}

func bundleIDs(a *Authority) []string {
	var out []string
	for _, c := range a.Bundle().X509Authorities() {
		out = append(out, c.SerialNumber.Text(16))
	}
	sort.Strings(out)
	return out
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}

// TestConflictReloadsAndDecidesAgain: another writer commits between this
// Authority's load and its commit. Its own version is dropped, never
// published; it reloads and, deciding again, finds the rotation done.
func TestConflictReloadsAndDecidesAgain(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	a, err := New(backendConfig(clk, mem, nil))
	require.NoError(t, err)
	b, err := New(backendConfig(clk, mem, nil))
	require.NoError(t, err)
	published := b.Subscribe()

	var fired atomic.Bool
	mem.beforeCommit = func() {
		if fired.CompareAndSwap(false, true) { // a's own commit runs this too
			require.NoError(t, a.Rotate())
		}
	}
	require.NoError(t, b.Rotate())

	ids := mem.rootIDs(t)
	require.Len(t, ids, 2, "one rotation, not two")
	assert.Equal(t, sorted(ids), bundleIDs(b), "b serves what a wrote")
	assert.Equal(t, bundleIDs(a), bundleIDs(b))
	// a bootstrapped, b's start published a new sequence (its first
	// write), the rotation one more; all in the same second.
	assert.Equal(t, uint64(t0.Unix())+2, b.Sequence())
	select {
	case <-published:
	default:
		t.Fatal("b published the reloaded state")
	}
}

// TestConflictEveryTimeKeepsTheStoredState: a writer that keeps losing
// gives up with ErrConflict and serves the stored state, not its own.
func TestConflictEveryTimeKeepsTheStoredState(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	a, err := New(backendConfig(clk, mem, nil))
	require.NoError(t, err)
	b, err := New(backendConfig(clk, mem, nil))
	require.NoError(t, err)
	before := b.Bundle()

	// Every commit of b loses against a write of a's that changes nothing
	// but the version.
	mem.beforeCommit = func() {
		mem.mu.Lock()
		mem.version++
		mem.mu.Unlock()
	}
	err = b.Rotate()
	require.ErrorIs(t, err, castate.ErrConflict)
	mem.beforeCommit = nil
	assert.Equal(t, before, b.Bundle(), "nothing of b's own published")
	assert.Len(t, b.Roots(), 1)
	assert.Len(t, mem.rootIDs(t), 1, "nothing written")
	assert.Equal(t, bundleIDs(a), bundleIDs(b))
}

func TestFollowerServesAndSignsWithTheLeadersState(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	follower, err := New(backendConfig(clk, mem, leaderFlag(false)))
	require.NoError(t, err, "a follower starts before any state exists")
	id := spiffeid.RequireFromPath(tdExample, "/w")

	t.Run("no state yet: not ready", func(t *testing.T) {
		require.Error(t, follower.Ready())
		assert.Contains(t, follower.Ready().Error(), "the leader creates it")
		_, err := follower.Sign(workloadCSR(t, id), id, 0)
		require.ErrorIs(t, err, ErrInvalidSigningMaterial)
		require.NotNil(t, follower.Bundle())
		assert.Empty(t, follower.Bundle().X509Authorities())
		assert.Equal(t, uint64(0), follower.Sequence())
		assert.ErrorIs(t, follower.Rotate(), castate.ErrNotLeader)
		assert.Zero(t, mem.commits, "a follower never writes")
	})

	leader, err := New(backendConfig(clk, mem, leaderFlag(true)))
	require.NoError(t, err)
	require.NoError(t, follower.Reload())

	t.Run("serves the leader's bundle and signs with its active root", func(t *testing.T) {
		require.NoError(t, follower.Ready())
		assert.True(t, leader.Bundle().Equal(follower.Bundle()))
		res, err := follower.Sign(workloadCSR(t, id), id, 0)
		require.NoError(t, err)
		pool := x509.NewCertPool()
		for _, c := range leader.Bundle().X509Authorities() {
			pool.AddCert(c)
		}
		_, err = res.Leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: clk.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		require.NoError(t, err)
	})

	t.Run("a follower does not rotate when a rotation is due", func(t *testing.T) {
		clk.SetTime(t0.Add(12 * time.Hour))
		commits := mem.commits
		require.NoError(t, follower.Reconcile())
		assert.Equal(t, commits, mem.commits)
		assert.Len(t, follower.Roots(), 1)
		require.NoError(t, leader.Reconcile())
		assert.Len(t, leader.Roots(), 2, "the leader prepared a successor")
		require.NoError(t, follower.Reconcile())
		assert.True(t, leader.Bundle().Equal(follower.Bundle()), "and the follower picked it up")
	})
}

// TestLeadershipLostBeforeCommit: a leader that loses its lease between
// deciding and writing writes nothing and publishes nothing.
func TestLeadershipLostBeforeCommit(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	l := leaderFlag(true)
	a, err := New(backendConfig(clk, mem, l))
	require.NoError(t, err)
	before := a.Bundle()
	commits := mem.commits
	mem.beforeCommit = func() { t.Fatal("no commit without leadership") }
	calls := 0
	a.cfg.Leader = castate.LeaderFunc(func() bool { calls++; return calls == 1 })
	err = a.Rotate()
	require.ErrorIs(t, err, castate.ErrNotLeader)
	assert.Equal(t, commits, mem.commits)
	assert.Equal(t, before, a.Bundle())
	assert.Len(t, a.Roots(), 1)
}

// TestFailoverKeepsThePublicationLead: a replica that served a prepared
// root while following keeps its lead when it takes over; one that began
// serving it only later restarts the lead from then.
func TestFailoverKeepsThePublicationLead(t *testing.T) {
	prepare := t0.Add(12 * time.Hour)
	tests := []struct {
		name      string
		firstSeen time.Time // when the new leader first loaded the prepared root
		wantFrom  time.Time // lead counted from
	}{
		{"follower that saw the root moments later", prepare.Add(time.Second), prepare.Add(time.Second)},
		{"replica started after a gap", prepare.Add(3 * time.Minute), prepare.Add(3 * time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			mem := newMemBackend()
			l1, l2 := leaderFlag(true), leaderFlag(false)
			a, err := New(backendConfig(clk, mem, l1))
			require.NoError(t, err)
			clk.SetTime(prepare)
			require.NoError(t, a.Reconcile())
			require.Len(t, a.Roots(), 2)

			clk.SetTime(tt.firstSeen)
			b, err := New(backendConfig(clk, mem, l2))
			require.NoError(t, err)
			require.Len(t, b.Roots(), 2)

			// a dies; b takes over two minutes after preparation.
			l1.v.Store(false)
			l2.v.Store(true)
			clk.SetTime(prepare.Add(4 * time.Minute))
			require.NoError(t, b.Reconcile())
			var prepared RootInfo
			for _, r := range b.Roots() {
				if r.State == castate.StatePrepared {
					prepared = r
				}
			}
			require.NotEmpty(t, prepared.ID)
			assert.Equal(t, tt.wantFrom, prepared.PublishedAt)

			clk.SetTime(tt.wantFrom.Add(5*time.Minute - time.Second))
			require.NoError(t, b.Reconcile())
			assert.Equal(t, castate.StatePrepared, stateOf(t, b, prepared.ID), "not before the lead")
			clk.SetTime(tt.wantFrom.Add(5 * time.Minute))
			require.NoError(t, b.Reconcile())
			assert.Equal(t, castate.StateActive, stateOf(t, b, prepared.ID))
			require.NoError(t, a.Reconcile(), "the old leader only follows")
			assert.Equal(t, castate.StateActive, stateOf(t, a, prepared.ID))
			assert.Len(t, mem.rootIDs(t), 2, "no duplicated rotation")
		})
	}
}

func stateOf(t *testing.T, a *Authority, id string) castate.RootState {
	t.Helper()
	for _, r := range a.Roots() {
		if r.ID == id {
			return r.State
		}
	}
	t.Fatalf("root %s gone", id)
	return ""
}

// TestKickReloadsAFollowerAtOnce runs a follower's scheduler; a Recheck (a
// watch seeing the leader's write) reloads without waiting for the next
// check.
func TestKickReloadsAFollowerAtOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	follower, err := New(backendConfig(clk, mem, leaderFlag(false)))
	require.NoError(t, err)
	changes := follower.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- follower.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	_, err = New(backendConfig(clk, mem, leaderFlag(true)))
	require.NoError(t, err)
	follower.Recheck()
	select {
	case <-changes:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not reload")
	}
	require.NoError(t, follower.Ready())
}

func TestFileBackendRefusesAStaleCommit(t *testing.T) {
	s, j, _ := storeWithRoot(t)
	b := fileBackend{s}
	j2, roots, keys, v, err := b.Load("example.org")
	require.NoError(t, err)
	j.Sequence = 5
	require.NoError(t, s.saveJournal(j)) // a writer that bypasses the lock
	before := snapshotDir(t, s.Dir())
	j2.Sequence++
	_, err = b.Commit(v, j2, roots, keys)
	require.ErrorIs(t, err, castate.ErrConflict)
	assert.Equal(t, before, snapshotDir(t, s.Dir()), "nothing written")
}

func TestFileBackendCommitPrunesAndWritesNewRoots(t *testing.T) {
	s, _, oldID := storeWithRoot(t)
	b := fileBackend{s}
	j, _, _, v, err := b.Load("example.org")
	require.NoError(t, err)
	cert, key, err := newRootCert(tdExample, KeyECP256, t0, 24*time.Hour, false)
	require.NoError(t, err)
	r := &castate.Root{RootRecord: castate.RootRecord{ID: cert.SerialNumber.Text(16), State: castate.StateActive, CertSHA256: fingerprint(cert)}, Cert: cert, Key: key}
	j.Roots = []castate.RootRecord{r.RootRecord}
	require.NoError(t, os.WriteFile(s.Dir()+"/roots/.x.key.pem.tmp-1", []byte("k"), 0o600))
	v2, err := b.Commit(v, j, []*castate.Root{r}, nil)
	require.NoError(t, err)
	assert.NotEqual(t, v, v2)
	got, err := b.Version()
	require.NoError(t, err)
	assert.Equal(t, v2, got)
	files := s.rootFiles()
	assert.ElementsMatch(t, []string{castate.RootCertKey(r.ID), castate.RootKeyKey(r.ID)}, files, "old root %s and leftovers pruned", oldID)

	_, err = b.Commit(v2, j, nil, nil)
	assert.ErrorContains(t, err, "journal names 1 roots, 0 given")
}

func TestDecodeRootNeverQuotesTheKey(t *testing.T) {
	cert, key, err := newRootCert(tdExample, KeyECP256, t0, time.Hour, false)
	require.NoError(t, err)
	r := &castate.Root{RootRecord: castate.RootRecord{ID: "ab", CertSHA256: fingerprint(cert)}, Cert: cert, Key: key}
	c, k, err := castate.EncodeRoot(r)
	require.NoError(t, err)
	got, err := castate.DecodeRoot(r.RootRecord, c, k)
	require.NoError(t, err)
	assert.True(t, got.Cert.Equal(cert))
	_, otherKey, err := newRootCert(tdExample, KeyECP256, t0, time.Hour, false)
	require.NoError(t, err)
	_, k2, err := castate.EncodeRoot(&castate.Root{Cert: cert, Key: otherKey})
	require.NoError(t, err)
	for _, bad := range [][]byte{k2, k[:len(k)/2], []byte("not pem")} {
		_, err = castate.DecodeRoot(r.RootRecord, c, bad)
		require.ErrorIs(t, err, castate.ErrCorruptState)
		assert.NotContains(t, err.Error(), string(k[30:60]))
		assert.NotContains(t, err.Error(), string(k2[30:60]))
	}
}

// A replica configured with a longer maximum workload TTL than the leader
// signs no leaf longer than the journal's recorded maximum: the leader
// removes a retired root once that has passed. The recorded maximum only
// shortens leaves; requests are refused over the configured maximum alone.
func TestFollowerClampsWorkloadTTLToRecordedMax(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	_, err := New(backendConfig(clk, mem, leaderFlag(true))) // maximum 2h
	require.NoError(t, err)
	fcfg := backendConfig(clk, mem, leaderFlag(false))
	fcfg.WorkloadTTL, fcfg.MaxWorkloadTTL = 3*time.Hour, 4*time.Hour
	follower, err := New(fcfg)
	require.NoError(t, err)
	id := spiffeid.RequireFromPath(tdExample, "/w")
	tests := []struct {
		name     string
		ttl      time.Duration
		notAfter time.Time
		err      error
	}{
		{"default over the recorded maximum", 0, t0.Add(2 * time.Hour), nil},
		{"request over the recorded maximum", 3 * time.Hour, t0.Add(2 * time.Hour), nil},
		{"request under the recorded maximum", time.Hour, t0.Add(time.Hour), nil},
		{"request over the configured maximum", 5 * time.Hour, time.Time{}, ErrInvalidTTL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := follower.Sign(workloadCSR(t, id), id, tt.ttl)
			if tt.err != nil {
				assert.ErrorIs(t, err, tt.err)
				assert.ErrorContains(t, err, "4h0m0s", "the configured maximum is the one a client can act on")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.notAfter, res.Leaf.NotAfter)
		})
	}
}

// A rollout that raises --max-workload-ttl and --workload-ttl above the
// journal's recorded maximum: the new pods follow the old leader until one
// leads, and must start meanwhile. Their serving certificates and the
// leaves they sign succeed, no longer than the recorded maximum.
func TestFollowerWithRaisedMaxWorkloadTTLStarts(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	lcfg := backendConfig(clk, mem, leaderFlag(true))
	lcfg.WorkloadTTL, lcfg.MaxWorkloadTTL = 30*time.Minute, time.Hour
	_, err := New(lcfg)
	require.NoError(t, err)
	fcfg := backendConfig(clk, mem, leaderFlag(false))
	fcfg.WorkloadTTL, fcfg.MaxWorkloadTTL, fcfg.RootTTL = 12*time.Hour, 24*time.Hour, 72*time.Hour
	follower, err := New(fcfg)
	require.NoError(t, err)
	bound := t0.Add(time.Hour)

	sc, err := follower.ServingCert(servingID, 12*time.Hour, WithDNSNames("trustbridge.trustbridge.svc"))
	require.NoError(t, err, "the pod must start")
	assert.Equal(t, bound, sc.Leaf().NotAfter, "clamped to the recorded maximum")
	assert.True(t, sc.nextRenewal().Before(bound), "renewed within the clamped lifetime, at %s", sc.nextRenewal())

	id := spiffeid.RequireFromPath(tdExample, "/w")
	for _, ttl := range []time.Duration{0, 12 * time.Hour, 24 * time.Hour} {
		res, err := follower.Sign(workloadCSR(t, id), id, ttl)
		require.NoError(t, err, "ttl %s", ttl)
		assert.Equal(t, bound, res.Leaf.NotAfter, "ttl %s: clamped to the recorded maximum", ttl)
	}
}
