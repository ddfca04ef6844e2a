package ca

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
)

func change(t *testing.T, a *Authority, c AuthorityChange) string {
	t.Helper()
	id, err := a.ChangeAuthority(c)
	require.NoError(t, err)
	return id
}

func rootByID(t *testing.T, a *Authority, id string) RootInfo {
	t.Helper()
	for _, r := range a.Roots() {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("root %s not listed", id)
	return RootInfo{}
}

func published(a *Authority, r RootInfo) bool {
	for _, c := range a.Bundle().X509Authorities() {
		if c.Equal(r.Cert) {
			return true
		}
	}
	return false
}

// TestAuthorityIncidentResponse walks the X.509 incident-response path:
// prepare a successor, activate it at once, taint the suspect root, revoke
// it, with each refusal that would break the trust domain on the way, and
// a restart after each step keeps what it did.
func TestAuthorityIncidentResponse(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	old := a.Roots()[0].ID
	restart := func() {
		t.Helper()
		cfg.Registerer = prometheus.NewRegistry()
		a, err = New(cfg)
		require.NoError(t, err)
	}

	_, err = a.ChangeAuthority(AuthorityChange{Action: "taint", ID: old})
	assert.ErrorIs(t, err, castate.ErrAuthorityState)
	assert.ErrorContains(t, err, "is active", "the active root cannot be tainted")
	_, err = a.ChangeAuthority(AuthorityChange{Action: "revoke", ID: old})
	assert.ErrorIs(t, err, castate.ErrAuthorityState)
	_, err = a.ChangeAuthority(AuthorityChange{Action: "promote", ID: old})
	assert.ErrorContains(t, err, "unknown action")
	_, err = a.ChangeAuthority(AuthorityChange{Action: "taint", ID: "ab"})
	assert.ErrorIs(t, err, castate.ErrAuthorityNotFound)

	next := change(t, a, AuthorityChange{Action: "prepare"})
	assert.NotEqual(t, old, next)
	assert.Equal(t, next, change(t, a, AuthorityChange{Action: "prepare"}), "a prepared root waits already: nothing new")
	assert.True(t, published(a, rootByID(t, a, next)), "published before it signs")
	_, err = a.ChangeAuthority(AuthorityChange{Action: "activate", ID: next})
	assert.ErrorContains(t, err, "--now", "before its lead, activation needs --now")

	restart()
	assert.Equal(t, next, change(t, a, AuthorityChange{Action: "activate", Now: true}))
	assert.Equal(t, castate.StateActive, rootByID(t, a, next).State)
	assert.Equal(t, castate.StateRetired, rootByID(t, a, old).State)
	id := spiffeid.RequireFromPath(tdExample, "/w")
	issued, err := a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	assert.Equal(t, rootByID(t, a, next).Cert.SubjectKeyId, issued.Leaf.AuthorityKeyId, "the successor signs")

	_, err = a.ChangeAuthority(AuthorityChange{Action: "revoke", ID: old})
	assert.ErrorContains(t, err, "taint it first")
	change(t, a, AuthorityChange{Action: "taint", ID: old})
	restart()
	tainted := rootByID(t, a, old)
	assert.Equal(t, clk.Now(), tainted.TaintedAt, "the taint survives a restart")
	assert.True(t, published(a, tainted), "a tainted root is still trusted until revoked")
	_, err = a.ChangeAuthority(AuthorityChange{Action: "taint", ID: old})
	assert.ErrorContains(t, err, "tainted since")

	clk.Step(time.Second)
	seq := a.Sequence()
	change(t, a, AuthorityChange{Action: "revoke", ID: old})
	assert.Greater(t, a.Sequence(), seq, "the bundle changed")
	revoked := rootByID(t, a, old)
	assert.Equal(t, castate.StateRevoked, revoked.State)
	assert.Equal(t, clk.Now(), revoked.RevokedAt)
	assert.False(t, published(a, revoked), "a revoked root leaves the bundle at once")
	_, err = os.Stat(filepath.Join(cfg.DataDir, "ca", "roots", old+".key.pem"))
	assert.ErrorIs(t, err, os.ErrNotExist, "its key is deleted")

	restart()
	assert.Equal(t, castate.StateRevoked, rootByID(t, a, old).State, "a restart remembers the revocation")
	assert.False(t, published(a, rootByID(t, a, old)))
	_, err = a.ChangeAuthority(AuthorityChange{Action: "revoke", ID: old})
	assert.ErrorIs(t, err, castate.ErrAuthorityNotFound, "revoked once is gone")

	// Once it has expired, nothing it signed is valid: it is forgotten.
	clk.SetTime(revoked.Cert.NotAfter.Add(time.Second))
	require.NoError(t, a.Reconcile())
	for _, r := range a.Roots() {
		assert.NotEqual(t, old, r.ID, "an expired revoked root is forgotten")
	}
}

// TestAuthorityRevokePrepared: a prepared root signed nothing and may be
// revoked without a taint; the plan then prepares another in its time.
func TestAuthorityRevokePrepared(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(testConfig(t, clk))
	require.NoError(t, err)
	next := change(t, a, AuthorityChange{Action: "prepare"})
	_, err = a.ChangeAuthority(AuthorityChange{Action: "taint", ID: next})
	assert.ErrorContains(t, err, "revoke it instead")
	change(t, a, AuthorityChange{Action: "revoke", ID: next})
	assert.Len(t, a.Bundle().X509Authorities(), 1)
	clk.Step(10 * time.Minute)
	require.NoError(t, a.Reconcile())
	for _, r := range a.Roots() {
		if r.ID == next {
			assert.Equal(t, castate.StateRevoked, r.State, "the revoked root never comes back, nor activates")
		}
	}
}

func TestAuthorityJWTIncidentResponse(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(jwtConfig(t, clk))
	require.NoError(t, err)
	old := activeKID(t, a)
	next := change(t, a, AuthorityChange{Action: "prepare", JWT: true})
	_, err = a.ChangeAuthority(AuthorityChange{Action: "activate", JWT: true})
	assert.ErrorContains(t, err, "--now")
	change(t, a, AuthorityChange{Action: "activate", JWT: true, Now: true})
	assert.Equal(t, next, signedKID(t, a), "the successor signs at once")
	_, err = a.ChangeAuthority(AuthorityChange{Action: "taint", JWT: true, ID: next})
	assert.ErrorIs(t, err, castate.ErrAuthorityState)
	change(t, a, AuthorityChange{Action: "taint", JWT: true, ID: old})
	_, ok := a.Bundle().FindJWTAuthority(old)
	assert.True(t, ok, "tainted, still published")
	change(t, a, AuthorityChange{Action: "revoke", JWT: true, ID: old})
	_, ok = a.Bundle().FindJWTAuthority(old)
	assert.False(t, ok, "revoked: gone from the bundle")
	var states []string
	for _, k := range a.JWTKeys() {
		states = append(states, k.KID[:4]+"="+string(k.State))
	}
	assert.ElementsMatch(t, []string{next[:4] + "=active", old[:4] + "=revoked"}, states)
}

func TestAuthorityChangeRefusedOffLeader(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	_, err := New(cfg)
	require.NoError(t, err)
	cfg.Registerer = prometheus.NewRegistry()
	cfg.Leader = leaderFunc(func() bool { return false })
	f, err := New(cfg)
	require.NoError(t, err)
	_, err = f.ChangeAuthority(AuthorityChange{Action: "prepare"})
	assert.ErrorIs(t, err, castate.ErrNotLeader)
}

// TestServingCertReissuedOnTaint: the server's own certificates (bundle
// endpoint, gRPC) are re-issued from the new root once the one that
// signed them is tainted, without waiting for half their life.
func TestServingCertReissuedOnTaint(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(testConfig(t, clk))
	require.NoError(t, err)
	sc, err := a.ServingCert(spiffeid.RequireFromPath(tdExample, "/bundle-endpoint"), time.Hour)
	require.NoError(t, err)
	old := a.Roots()[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- sc.Run(ctx) }()
	defer func() { cancel(); <-done }()

	change(t, a, AuthorityChange{Action: "prepare"})
	next := change(t, a, AuthorityChange{Action: "activate", Now: true})
	change(t, a, AuthorityChange{Action: "taint", ID: old.ID})
	want := rootByID(t, a, next).Cert.SubjectKeyId
	require.Eventually(t, func() bool { return string(sc.Leaf().AuthorityKeyId) == string(want) }, 10*time.Second, 5*time.Millisecond,
		"re-issued by the new root")
}

func TestJournalRefusesTaintedActiveAndRevokedInUse(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	_, err := New(cfg)
	require.NoError(t, err)
	path := filepath.Join(cfg.DataDir, "ca", "state.json")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	tainted := strings.Replace(string(data), `"state": "active",`, `"state": "active", "tainted_at": "2026-01-01T00:00:00Z",`, 1)
	require.NotEqual(t, string(data), tainted)
	_, err = castate.DecodeJournal([]byte(tainted), "")
	assert.ErrorContains(t, err, "active and tainted")

	// A revoked root, then the journal edited in each way that would
	// publish it again or hide it.
	a, err := New(func() Config { cfg.Registerer = prometheus.NewRegistry(); return cfg }())
	require.NoError(t, err)
	old := a.Roots()[0]
	for _, c := range []AuthorityChange{{Action: "prepare"}, {Action: "activate", Now: true}, {Action: "taint", ID: old.ID}, {Action: "revoke", ID: old.ID}} {
		change(t, a, c)
	}
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	good, err := castate.DecodeJournal(data, "")
	require.NoError(t, err)
	require.Len(t, good.Revoked, 1)
	edits := map[string]func(j *castate.Journal){
		"is also in use": func(j *castate.Journal) {
			back := *j.Revoked[0].Root
			back.State = castate.StateRetired
			j.Roots = append(j.Roots, back)
		},
		"not \"revoked\"":           func(j *castate.Journal) { j.Revoked[0].Root.State = castate.StateRetired },
		"does not match its record": func(j *castate.Journal) { j.Revoked[0].DER = j.Revoked[0].DER[:len(j.Revoked[0].DER)-1] },
		"neither one root nor one JWT key": func(j *castate.Journal) {
			j.Revoked[0].JWTKey = &castate.JWTKeyRecord{KID: "x", State: castate.StateRevoked}
		},
	}
	for want, edit := range edits {
		j, err := castate.DecodeJournal(data, "")
		require.NoError(t, err)
		edit(j)
		out, err := castate.EncodeJournal(j)
		require.NoError(t, err)
		_, err = castate.DecodeJournal(out, "")
		assert.ErrorIs(t, err, castate.ErrCorruptState, want)
		assert.ErrorContains(t, err, want)
	}
}

type leaderFunc func() bool

func (f leaderFunc) IsLeader() bool { return f() }

// TestAuthorityUpstreamIncidentResponse: in upstream mode prepare asks the
// upstream for a new intermediate, which signs at once (the upstream's
// roots are published already); the old one is tainted, then revoked: it
// was never in the bundle, whose keys do not change, but the document
// does (it names the revoked intermediate), so the sequence moves.
func TestAuthorityUpstreamIncidentResponse(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	old := a.Roots()[0]
	require.NotNil(t, old.Upstream)

	clk.Step(time.Second)
	next := change(t, a, AuthorityChange{Action: "prepare"})
	assert.Equal(t, 2, u.callCount(), "the upstream signed a second intermediate")
	assert.Equal(t, castate.StateActive, rootByID(t, a, next).State, "it signs at once")
	assert.Equal(t, castate.StateRetired, rootByID(t, a, old.ID).State)
	issued := leafVerifies(t, a)
	assert.True(t, issued.Chain[1].Equal(rootByID(t, a, next).Cert))

	change(t, a, AuthorityChange{Action: "taint", ID: old.ID})
	seq := a.Sequence()
	keys := a.Bundle().X509Authorities()
	clk.Step(time.Second)
	change(t, a, AuthorityChange{Action: "revoke", ID: old.ID})
	assert.Greater(t, a.Sequence(), seq)
	assert.Equal(t, keys, a.Bundle().X509Authorities(), "the upstream's roots stay")
	assert.Equal(t, castate.StateRevoked, rootByID(t, a, old.ID).State)
	assert.NotNil(t, rootByID(t, a, old.ID).Upstream, "listed as the intermediate it was")
	leafVerifies(t, a)
}

// TestAuthorityChangeRefusedInPluginMode: a plug-in CA's roots are
// managed where its directory comes from.
func TestAuthorityChangeRefusedInPluginMode(t *testing.T) {
	a := newPluginAuthority(t, clocktesting.NewFakeClock(t0), Config{Backend: newMemBackend()})
	_, err := a.ChangeAuthority(AuthorityChange{Action: "prepare"})
	assert.ErrorIs(t, err, castate.ErrAuthorityState)
	assert.ErrorContains(t, err, "--ca-dir")
}
