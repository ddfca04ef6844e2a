package statusui

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// ownJWTKey is one of the local CA's JWT signing keys.
func ownJWTKey(kid, state string, created, notAfter *time.Time) api.Authority {
	a := jwtKey(kid)
	a.State, a.Since = state, created
	a.PublicKeyAlgorithm, a.KeyBits, a.Curve, a.Algorithm = "ECDSA", 256, "P-256", "ES256"
	a.Thumbprint = "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"
	a.JWTKey = &api.JWTKey{CreatedAt: created, NotAfter: notAfter}
	return a
}

// The page shows every trust domain's JWT authorities with their key,
// algorithm and thumbprint, and the own CA's JWT keys by state, apart
// from its roots.
func TestPageJWTAuthorities(t *testing.T) {
	root := localRoot("active", "CN=east root", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", at("2026-01-01T00:00:00Z"))
	active := ownJWTKey("k-active", "active", ago(20*24*time.Hour), at("2026-12-02T12:00:00Z"))
	next := ownJWTKey("k-next", "prepared", ago(time.Hour), at("2026-12-22T11:00:00Z"))
	peerKey := jwtKey("west-1")
	peerKey.PublicKeyAlgorithm, peerKey.KeyBits, peerKey.Algorithm, peerKey.Thumbprint = "RSA", 2048, "RS256/PS256", "dGhpcyBpcyBub3QgYSByZWFsIHRodW1icHJpbnQ"
	s := api.Snapshot{Time: fixtureNow, TrustDomain: "east.example", TrustDomains: []api.TrustDomain{
		{Name: "east.example", Local: true, JWTIssuer: true, Sources: []string{"ca"}, Authorities: []api.Authority{root, active, next}},
		{Name: "west.example", Sources: []string{"federation:west.example"}, Authorities: []api.Authority{peerKey},
			Federation: &api.Federation{EndpointURL: "https://west.example/", Profile: "https_web", State: "ok"}},
	}}

	p := build(s, nil, false)
	assert.Equal(t, 1, p.Summary.ActiveRoots, "JWT keys are not roots")
	assert.Zero(t, p.Summary.PreparedRoots)
	assert.Equal(t, &keyCounts{Active: 1, Prepared: 1}, p.Summary.JWT)
	assert.Equal(t, "2027-01-01 00:00", p.Summary.Expiry.Abs, "the next expiry stays the roots', not a JWT key's 30-day life")

	rec := serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assertInert(t, d)
	assert.Equal(t, "JWT keys: 1 active · 1 prepared · 0 retired", text(d.byID("jwt-keys")))

	rows := d.withClass("authority-row")
	require.Len(t, rows, 4)
	own := text(rows[1])
	for _, want := range []string{"east.example", "JWT", "active", "key k-active", "ECDSA P-256", "ES256", "jwk NzbLsXh8uDC…", "2026-12-02 12:00"} {
		assert.Contains(t, own, want)
	}
	until := parseDOMNode(rows[1]).withClass("date")
	require.NotEmpty(t, until)
	assert.True(t, hasClass(until[1], "exp-fine"), "a JWT key 10 days from its end is not drawn as a root 10 days from expiry")
	assert.Contains(t, text(rows[2]), "prepared")
	peer := text(rows[3])
	for _, want := range []string{"west.example", "JWT", "trusted", "key west-1", "RSA 2048", "RS256/PS256", "jwk dGhpcyBpcyB…"} {
		assert.Contains(t, peer, want)
	}

	s.TrustDomains[0].JWTIssuer = false
	rec = serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	assert.Nil(t, parseDOM(t, rec.Body).byID("jwt-keys"), "no JWT key line from a CA that mints no JWT-SVIDs")
}
