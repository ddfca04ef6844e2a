package statusui

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// A tainted authority of the own CA is shown above everything else, with
// the command that revokes it, until it is revoked; a revoked one is
// struck through, labelled, and no longer counted as trusted.
func TestPageTaintedAndRevokedAuthorities(t *testing.T) {
	active := localRoot("active", "CN=east root 2", "2026-11-01T00:00:00Z", "2027-11-01T00:00:00Z", ago(time.Hour))
	active.ID = "02"
	tainted := localRoot("retired", "CN=east root 1", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", ago(time.Hour))
	tainted.ID, tainted.TaintedAt = "01", ago(30*time.Minute)
	revoked := localRoot("revoked", "CN=east root 0", "2025-06-01T00:00:00Z", "2026-12-01T00:00:00Z", ago(10*time.Minute))
	revoked.ID, revoked.TaintedAt, revoked.RevokedAt = "00", ago(2*time.Hour), ago(10*time.Minute)
	key := ownJWTKey("k-old", "retired", ago(20*24*time.Hour), at("2026-12-02T12:00:00Z"))
	key.TaintedAt = ago(30 * time.Minute)
	s := api.Snapshot{Time: fixtureNow, TrustDomain: "east.example", TrustDomains: []api.TrustDomain{
		{Name: "east.example", Local: true, Sources: []string{"ca"}, Authorities: []api.Authority{active, tainted, revoked, key}},
	}}

	p := build(s, nil, false)
	assert.Equal(t, 2, p.Summary.X509, "a revoked root is not trusted")
	assert.Equal(t, "2027-01-01 00:00", p.Summary.Expiry.Abs, "nor is it the next expiry")
	require.Len(t, p.Tainted, 2)

	rec := serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assertInert(t, d)
	panel := d.byID("tainted")
	require.NotNil(t, panel, "tainted authorities are shown prominently")
	items := parseDOMNode(panel).withClass("tainted-authority")
	require.Len(t, items, 2)
	assert.Contains(t, text(items[0]), "root 01 · east root 1")
	assert.Contains(t, text(items[0]), "trustbridge ca authority revoke --x509 01")
	assert.Contains(t, text(items[1]), "trustbridge ca authority revoke --jwt k-old")

	rows := d.withClass("authority-row")
	require.Len(t, rows, 4)
	assert.Contains(t, text(rows[1]), "tainted 30m ago")
	assert.False(t, hasClass(rows[1], "revoked"))
	assert.True(t, hasClass(rows[2], "revoked"), "a revoked root is struck through")
	assert.Contains(t, text(rows[2]), "revoked")

	s.TrustDomains[0].Authorities = []api.Authority{active, revoked}
	rec = serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	assert.Nil(t, parseDOM(t, rec.Body).byID("tainted"), "nothing tainted left: no panel")
}
