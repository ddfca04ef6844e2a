package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// TestCABundleSourceNamesRevokedAuthorities: once an operator revoked a
// root and a JWT key, the bundle endpoint's local source names both, and
// the bundle no longer carries them, so the document renders.
func TestCABundleSourceNamesRevokedAuthorities(t *testing.T) {
	a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), DataDir: t.TempDir(), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	src := caBundleSource{a}
	assert.Empty(t, src.Revocations())
	oldRoot, oldKID := a.Roots()[0], a.JWTKeys()[0].KID
	for _, jwt := range []bool{false, true} {
		old := oldRoot.ID
		if jwt {
			old = oldKID
		}
		for _, c := range []ca.AuthorityChange{{Action: "prepare", JWT: jwt}, {Action: "activate", JWT: jwt, Now: true},
			{Action: "taint", JWT: jwt, ID: old}, {Action: "revoke", JWT: jwt, ID: old}} {
			_, err := a.ChangeAuthority(c)
			require.NoError(t, err, "%+v", c)
		}
	}
	revs := src.Revocations()
	require.Len(t, revs, 2)
	assert.Contains(t, revs, bundledoc.RevokeX509(oldRoot.Cert))
	assert.Equal(t, bundledoc.UseJWTSVID, revs[1].Use)
	assert.Equal(t, oldKID, revs[1].KID)
	doc, err := bundledoc.MarshalWithRevocations(src.Bundle(), revs)
	require.NoError(t, err)
	got, err := bundledoc.ParseRevocations(doc)
	require.NoError(t, err)
	assert.Len(t, got, 2)
}
