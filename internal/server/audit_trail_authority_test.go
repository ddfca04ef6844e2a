package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

func observeRoots(t *auditTrail, roots []ca.RootInfo, baseline bool) {
	t.mu.Lock()
	entries := t.rootEntriesLocked(roots, "example.org", 9, baseline)
	t.mu.Unlock()
	for _, e := range entries {
		t.record(e)
	}
}

// A taint and a revocation are recorded once each, whichever path made
// them (the admin API, a restart, a follower's reload): the observer
// sees the state, not the request.
func TestAuditTrailRecordsTaintAndRevocation(t *testing.T) {
	trail, buf := newTestTrail(t)
	at := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	old := ca.RootInfo{RootRecord: castate.RootRecord{ID: "00", State: castate.StateRetired, CertSHA256: "aa"}}
	active := ca.RootInfo{RootRecord: castate.RootRecord{ID: "01", State: castate.StateActive, CertSHA256: "bb"}}
	observeRoots(trail, []ca.RootInfo{old, active}, true)
	require.Len(t, drain(t, buf), 2)

	old.TaintedAt = at
	observeRoots(trail, []ca.RootInfo{old, active}, false)
	got := drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "root_tainted", got[0].Event)
	assert.Equal(t, "root 00, tainted since 2026-12-07T01:00:00Z: clients re-issue what it signed", got[0].Reason)

	observeRoots(trail, []ca.RootInfo{old, active}, false)
	assert.Empty(t, drain(t, buf), "recorded once")

	old.State = castate.StateRevoked
	observeRoots(trail, []ca.RootInfo{old, active}, false)
	assert.Equal(t, []eventSummary{{event: "root_revoked", removed: []string{"x509:aa"}}}, summarize(drain(t, buf)))

	observeRoots(trail, []ca.RootInfo{active}, false)
	assert.Equal(t, []eventSummary{{event: "root_removed", removed: []string{"x509:aa"}}}, summarize(drain(t, buf)), "expired")

	// Both at once (a replica that missed the taint): the taint first.
	next := ca.RootInfo{RootRecord: castate.RootRecord{ID: "02", State: castate.StateRetired, CertSHA256: "cc"}}
	observeRoots(trail, []ca.RootInfo{active, next}, false)
	drain(t, buf)
	next.State, next.TaintedAt = castate.StateRevoked, at
	observeRoots(trail, []ca.RootInfo{active, next}, false)
	assert.Equal(t, []eventSummary{{event: "root_tainted"}, {event: "root_revoked", removed: []string{"x509:cc"}}}, summarize(drain(t, buf)))
}

func TestAuditTrailRecordsJWTKeyTaintAndRevocation(t *testing.T) {
	trail, buf := newTestTrail(t)
	at := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	pub := genPub(t)
	fp := "jwt:k1:" + api.SPKISHA256(pub)
	k := ca.JWTKeyInfo{JWTKeyRecord: castate.JWTKeyRecord{KID: "k1", State: castate.StateRetired}, Public: pub}
	observeJWT(trail, []ca.JWTKeyInfo{k}, true)
	baseline := drain(t, buf)
	require.Len(t, baseline, 1)
	assert.Equal(t, "jwt key k1 retired at start", baseline[0].Reason)

	k.TaintedAt = at
	observeJWT(trail, []ca.JWTKeyInfo{k}, false)
	assert.Equal(t, []eventSummary{{event: "jwt_key_tainted"}}, summarize(drain(t, buf)))
	observeJWT(trail, []ca.JWTKeyInfo{k}, false)
	assert.Empty(t, drain(t, buf), "recorded once")

	k.State, k.RevokedAt = castate.StateRevoked, at
	observeJWT(trail, []ca.JWTKeyInfo{k}, false)
	assert.Equal(t, []eventSummary{{event: "jwt_key_revoked", removed: []string{fp}}}, summarize(drain(t, buf)))

	// A restart: the baseline says where it stands.
	trail, buf = newTestTrail(t)
	observeJWT(trail, []ca.JWTKeyInfo{k}, true)
	got := drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "jwt key k1 revoked, tainted since 2026-12-07T01:00:00Z at start", got[0].Reason)
}
