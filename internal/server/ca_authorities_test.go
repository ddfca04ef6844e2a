package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
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

// TestCATaintsFollowTheCA: a taint reaches WatchBundles' source, closing
// the channel its readers hold; a revocation takes it out again.
func TestCATaintsFollowTheCA(t *testing.T) {
	a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), DataDir: t.TempDir(), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	taints := newCATaints()
	taints.update(a)
	var followed [][]certservice.Tainted
	taints.follow(func(ts []certservice.Tainted) { followed = append(followed, ts) })
	id := spiffeid.RequireFromString("spiffe://example.org/w")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	signedByOld, err := a.SignX509SVID(ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id})
	require.NoError(t, err)
	got, changed := taints.Tainted()
	assert.Empty(t, got)
	old := a.Roots()[0]
	for _, c := range []ca.AuthorityChange{{Action: "prepare"}, {Action: "activate", Now: true}} {
		_, err := a.ChangeAuthority(c)
		require.NoError(t, err)
	}
	taints.update(a)
	select {
	case <-changed:
		t.Fatal("nothing tainted yet: no change")
	default:
	}
	_, err = a.ChangeAuthority(ca.AuthorityChange{Action: "taint", ID: old.ID})
	require.NoError(t, err)
	taints.update(a)
	<-changed
	got, changed = taints.Tainted()
	require.Len(t, got, 1)
	assert.Equal(t, old.Cert.SubjectKeyId, got[0].X509SubjectKeyID)
	assert.Equal(t, old.CertSHA256, got[0].X509SHA256)
	require.Len(t, followed, 1, "followers (the server's SDS minter) hear of it")
	assert.True(t, signedByTainted(followed[0])(signedByOld.Leaf))
	signedByNew, err := a.SignX509SVID(ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id})
	require.NoError(t, err)
	assert.False(t, signedByTainted(followed[0])(signedByNew.Leaf))
	_, err = a.ChangeAuthority(ca.AuthorityChange{Action: "revoke", ID: old.ID})
	require.NoError(t, err)
	taints.update(a)
	<-changed
	got, _ = taints.Tainted()
	assert.Empty(t, got, "a revoked authority is no longer tainted: it is gone")
	assert.Nil(t, (*caTaints)(nil).source())
}
