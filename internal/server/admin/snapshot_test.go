package admin

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// The snapshot names the local trust domain first, with the CA's roots
// and their rotation state, then each other one with where it comes from.
func TestSnapshot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	offline := testca.New(t, localTD.Name())
	f.cfg.Trust.(*trust.Store).Set("file:/etc/offline.json", offline.Bundle())
	relayed := testca.New(t, "relay.example")
	f.cfg.Trust.(*trust.Store).Set("file:/etc/relay.json", relayed.Bundle())
	f.clock.Step(90 * time.Second)

	snap := New(f.cfg).Snapshot()
	assert.Equal(t, t0.Add(90*time.Second), snap.Time, "the injected clock")
	assert.Equal(t, "example.org", snap.TrustDomain)
	assert.Equal(t, "replica-0", snap.Actor)
	assert.True(t, snap.Leader, "no leader check: a single server leads")
	require.Len(t, snap.TrustDomains, 3)
	names := []string{}
	for _, v := range snap.TrustDomains {
		names = append(names, v.Name)
	}
	assert.Equal(t, []string{"example.org", "peer.example", "relay.example"}, names, "local first, then by name")

	local := snap.TrustDomains[0]
	assert.True(t, local.Local)
	assert.Equal(t, []string{"ca", "file:/etc/offline.json"}, local.Sources)
	require.NotNil(t, local.Sequence)
	assert.Equal(t, uint64(7), *local.Sequence, "the CA's sequence")
	assert.Nil(t, local.Federation)
	require.Len(t, local.Authorities, 3, "the CA's roots, then the bundle file's")
	assert.Equal(t, "active", local.Authorities[0].State)
	require.NotNil(t, local.Authorities[0].Since)
	assert.Equal(t, t0.Add(-24*time.Hour), *local.Authorities[0].Since, "active since activation")
	assert.Equal(t, "prepared", local.Authorities[1].State)
	assert.Equal(t, t0.Add(-time.Hour), *local.Authorities[1].Since, "prepared since preparation")
	assert.Equal(t, api.X509Authority(offline.Cert).SHA256, local.Authorities[2].SHA256)
	assert.Empty(t, local.Authorities[2].State, "not a CA root")

	peer := snap.TrustDomains[1]
	assert.False(t, peer.Local)
	assert.Equal(t, []string{"federation:peer.example"}, peer.Sources)
	require.NotNil(t, peer.Federation)
	assert.Equal(t, "file", peer.Federation.Origin)
	assert.Equal(t, "ok", peer.Federation.State)
	assert.Equal(t, "https_web", peer.Federation.Profile)
	assert.Equal(t, "https://peer.example/bundle", peer.Federation.EndpointURL)
	require.NotNil(t, peer.Sequence)
	assert.Equal(t, uint64(3), *peer.Sequence)
	require.Len(t, peer.Authorities, 1)
	assert.Equal(t, api.X509Authority(f.peer.Cert).SHA256, peer.Authorities[0].SHA256)

	relay := snap.TrustDomains[2]
	assert.Nil(t, relay.Federation, "trusted, not polled")
	assert.Nil(t, relay.Sequence, "the file has none")
	assert.Equal(t, []string{"file:/etc/relay.json"}, relay.Sources)
}

func TestSnapshotOfAFollower(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.cfg.IsLeader = func() bool { return false }
	f.cfg.Origin, f.cfg.Federation = nil, nil
	snap := New(f.cfg).Snapshot()
	assert.False(t, snap.Leader)
	require.Len(t, snap.TrustDomains, 2)
	assert.Nil(t, snap.TrustDomains[1].Federation, "without federation, the peer's bundle is only trusted")
	assert.Len(t, snap.TrustDomains[1].Authorities, 1)
}

func TestServeSnapshot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := New(f.cfg)
	rec := do(t, h, http.MethodGet, "/v1/snapshot")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	assert.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	indented := body(t, rec)
	assert.True(t, strings.HasPrefix(indented, "{\n  \"time\": \"2026-11-22T12:00:00Z\",\n"), indented)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(indented), &raw))
	assert.ElementsMatch(t, []string{"time", "trust_domain", "actor", "leader", "trust_domains"}, keys(raw))
	var snap api.Snapshot
	require.NoError(t, json.Unmarshal([]byte(indented), &snap))
	assert.Equal(t, h.Snapshot(), snap)

	compact := body(t, do(t, h, http.MethodGet, "/v1/snapshot?compact"))
	assert.True(t, strings.HasPrefix(compact, `{"time":"2026-11-22T12:00:00Z","trust_domain":"example.org",`), compact)
	assert.Equal(t, 1, strings.Count(compact, "\n"))

	page := body(t, do(t, h, http.MethodGet, "/ui"))
	assert.Contains(t, page, "peer.example", "the page draws the same snapshot")
}
