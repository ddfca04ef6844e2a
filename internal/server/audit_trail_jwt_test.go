package server

import (
	"bufio"
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

func newTestTrail(t *testing.T) (*auditTrail, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	trail, err := newAuditTrail(audit.New(&buf), "replica-1", nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return trail, &buf
}

// drain returns the entries written since the last call.
func drain(t *testing.T, buf *bytes.Buffer) []audit.Entry {
	t.Helper()
	var out []audit.Entry
	sc := bufio.NewScanner(buf)
	for sc.Scan() {
		var e audit.Entry
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e))
		out = append(out, e)
	}
	buf.Reset()
	return out
}

func genPub(t *testing.T) crypto.PublicKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k.Public()
}

func observeJWT(t *auditTrail, keys []ca.JWTKeyInfo, baseline bool) {
	t.mu.Lock()
	entries := t.jwtKeyEntriesLocked(keys, "example.org", 9, baseline)
	t.mu.Unlock()
	for _, e := range entries {
		t.record(e)
	}
}

type eventSummary struct {
	event          string
	added, removed []string
}

func summarize(es []audit.Entry) []eventSummary {
	out := []eventSummary{}
	for _, e := range es {
		out = append(out, eventSummary{event: e.Event, added: e.Added, removed: e.Removed})
	}
	return out
}

// The CA's JWT keys are audited through their life as its roots are: a
// baseline at start, then one entry per key that changed state, with the
// key's fingerprint where it enters or leaves the bundle.
func TestAuditTrailJWTKeyLifecycle(t *testing.T) {
	trail, buf := newTestTrail(t)
	a, b := genPub(t), genPub(t)
	fpA, fpB := "jwt:k-a:"+api.SPKISHA256(a), "jwt:k-b:"+api.SPKISHA256(b)
	key := func(kid string, state castate.RootState, pub crypto.PublicKey) ca.JWTKeyInfo {
		return ca.JWTKeyInfo{JWTKeyRecord: castate.JWTKeyRecord{KID: kid, State: state, Algorithm: "ES256"}, Public: pub}
	}

	steps := []struct {
		name string
		keys []ca.JWTKeyInfo
		want []eventSummary
	}{
		{"successor prepared", []ca.JWTKeyInfo{key("k-a", castate.StateActive, a), key("k-b", castate.StatePrepared, b)},
			[]eventSummary{{event: "jwt_key_prepared", added: []string{fpB}}}},
		{"nothing changed", []ca.JWTKeyInfo{key("k-a", castate.StateActive, a), key("k-b", castate.StatePrepared, b)}, []eventSummary{}},
		{"successor activated, predecessor retired", []ca.JWTKeyInfo{key("k-a", castate.StateRetired, a), key("k-b", castate.StateActive, b)},
			[]eventSummary{{event: "jwt_key_retired"}, {event: "jwt_key_activated"}}},
		{"retired key removed", []ca.JWTKeyInfo{key("k-b", castate.StateActive, b)},
			[]eventSummary{{event: "jwt_key_removed", removed: []string{fpA}}}},
		{"a kid reused for another key", []ca.JWTKeyInfo{key("k-b", castate.StateActive, a)},
			[]eventSummary{{event: "jwt_key_activated", added: []string{"jwt:k-b:" + api.SPKISHA256(a)}, removed: []string{fpB}}}},
	}
	observeJWT(trail, []ca.JWTKeyInfo{key("k-a", castate.StateActive, a)}, true)
	base := drain(t, buf)
	require.Len(t, base, 1)
	assert.Equal(t, "baseline", base[0].Event)
	assert.Equal(t, []string{fpA}, base[0].Added)
	assert.Equal(t, "example.org", base[0].TrustDomain)
	assert.Equal(t, "replica-1", base[0].Actor)
	assert.Contains(t, base[0].Reason, "jwt key k-a active at start")

	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			observeJWT(trail, s.keys, false)
			got := drain(t, buf)
			assert.Equal(t, s.want, summarize(got))
			for _, e := range got {
				require.NotNil(t, e.NewSequence)
				assert.Equal(t, uint64(9), *e.NewSequence)
			}
		})
	}
	assert.Equal(t, "jwt key k-a active -> retired", func() string {
		observeJWT(trail, []ca.JWTKeyInfo{key("k-a", castate.StateActive, a)}, true)
		drain(t, buf)
		observeJWT(trail, []ca.JWTKeyInfo{key("k-a", castate.StateRetired, a)}, false)
		return drain(t, buf)[0].Reason
	}())
}

// A follower writes nothing, but follows the keys: when it leads, it
// reports changes from what it last saw.
func TestAuditTrailJWTKeysOnAFollower(t *testing.T) {
	trail, buf := newTestTrail(t)
	leading := false
	trail.leader = func() bool { return leading }
	a := genPub(t)
	observeJWT(trail, []ca.JWTKeyInfo{{JWTKeyRecord: castate.JWTKeyRecord{KID: "k-a", State: castate.StatePrepared}, Public: a}}, false)
	assert.Empty(t, drain(t, buf))
	leading = true
	observeJWT(trail, []ca.JWTKeyInfo{{JWTKeyRecord: castate.JWTKeyRecord{KID: "k-a", State: castate.StateActive}, Public: a}}, false)
	got := drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, "jwt_key_activated", got[0].Event)
	assert.Empty(t, got[0].Added, "the key was already published")
}

// A federated peer's JWT authority set changing is in its bundle_accepted
// entry: kids added and removed, with their keys' fingerprints.
func TestAuditTrailPeerJWTAuthorities(t *testing.T) {
	trail, buf := newTestTrail(t)
	td := spiffeid.RequireTrustDomainFromString("peer.example")
	old, next := spiffebundle.New(td), spiffebundle.New(td)
	a, b := genPub(t), genPub(t)
	require.NoError(t, old.AddJWTAuthority("kid-old", a))
	require.NoError(t, next.AddJWTAuthority("kid-new", b))
	d := federation.Diff(old, next)
	trail.federationEvent(federation.Event{Kind: federation.EventBundleAccepted, TrustDomain: td, Added: d.Added, Removed: d.Removed})
	got := drain(t, buf)
	require.Len(t, got, 1)
	assert.Equal(t, []string{"jwt:kid-new:" + api.SPKISHA256(b)}, got[0].Added)
	assert.Equal(t, []string{"jwt:kid-old:" + api.SPKISHA256(a)}, got[0].Removed)
}
