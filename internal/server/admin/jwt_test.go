package admin

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// fakeJWTKeys is the CA's JWT signing keys.
type fakeJWTKeys []ca.JWTKeyInfo

func (k fakeJWTKeys) JWTKeys() []ca.JWTKeyInfo { return k }

func ecKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

// rfc7638 computes an EC P-256 key's JWK thumbprint by the letter of RFC
// 7638 §3: the required members in lexicographic order, no whitespace.
func rfc7638(t *testing.T, pub *ecdsa.PublicKey) string {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	raw, err := pub.Bytes() // 0x04 || X || Y
	require.NoError(t, err)
	x, y := raw[1:33], raw[33:]
	sum := sha256.Sum256([]byte(`{"crv":"P-256","kty":"EC","x":"` + b64(x) + `","y":"` + b64(y) + `"}`))
	return b64(sum[:])
}

// jwtFixture is the fixture with JWT authorities: the CA's active key
// "k-active" and its prepared successor "k-next" in the CA's bundle and
// records, and a peer RSA key "peer-1".
type jwtFixture struct {
	*fixture
	active, next *ecdsa.PrivateKey
	peerKey      *rsa.PrivateKey
	keys         fakeJWTKeys
}

func newJWTFixture(t *testing.T) *jwtFixture {
	t.Helper()
	f := &jwtFixture{fixture: newFixture(t), active: ecKey(t), next: ecKey(t)}
	var err error
	f.peerKey, err = rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	require.NoError(t, f.ca.bundle.AddJWTAuthority("k-active", f.active.Public()))
	require.NoError(t, f.ca.bundle.AddJWTAuthority("k-next", f.next.Public()))
	store := f.cfg.Trust.(*trust.Store)
	store.Set("ca", f.ca.bundle)
	peer := f.peer.Bundle()
	peer.SetSequenceNumber(3)
	require.NoError(t, peer.AddJWTAuthority("peer-1", f.peerKey.Public()))
	store.Set("federation:"+peerTD.Name(), peer)
	f.keys = fakeJWTKeys{
		{JWTKeyRecord: castate.JWTKeyRecord{KID: "k-active", State: castate.StateActive, Algorithm: "ES256",
			CreatedAt: t0.Add(-20 * 24 * time.Hour), NotAfter: t0.Add(10 * 24 * time.Hour),
			PreparedAt: t0.Add(-20 * 24 * time.Hour), ActivatedAt: t0.Add(-19 * 24 * time.Hour)}, Public: f.active.Public()},
		{JWTKeyRecord: castate.JWTKeyRecord{KID: "k-next", State: castate.StatePrepared, Algorithm: "ES256",
			CreatedAt: t0.Add(-time.Hour), NotAfter: t0.Add(29 * 24 * time.Hour), PreparedAt: t0.Add(-time.Hour)}, Public: f.next.Public()},
	}
	f.cfg.JWT = f.keys
	return f
}

func authorityByKID(t *testing.T, td api.TrustDomain, kid string) api.Authority {
	t.Helper()
	for _, a := range td.Authorities {
		if a.Kind == api.KindJWT && a.KeyID == kid {
			return a
		}
	}
	require.Failf(t, "no JWT authority", "kid %q in %s", kid, td.Name)
	return api.Authority{}
}

// Every trust domain's JWT authorities are in the snapshot with their key
// and its thumbprint; the CA's own carry their rotation state.
func TestSnapshotJWTAuthorities(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	snap := New(f.cfg).Snapshot()
	require.Len(t, snap.TrustDomains, 2)
	local, peer := snap.TrustDomains[0], snap.TrustDomains[1]
	assert.True(t, local.JWTIssuer)
	require.Len(t, local.Authorities, 4, "two roots, two JWT keys, nothing twice")

	active := authorityByKID(t, local, "k-active")
	assert.Equal(t, "active", active.State)
	assert.Equal(t, "ES256", active.Algorithm)
	assert.Equal(t, "ECDSA", active.PublicKeyAlgorithm)
	assert.Equal(t, "P-256", active.Curve)
	assert.Equal(t, 256, active.KeyBits)
	assert.Equal(t, rfc7638(t, &f.active.PublicKey), active.Thumbprint)
	assert.Equal(t, api.SPKISHA256(f.active.Public()), active.SHA256)
	assert.NotEmpty(t, active.PublicKey)
	require.NotNil(t, active.Since)
	assert.Equal(t, t0.Add(-19*24*time.Hour), *active.Since, "active since activation")
	require.NotNil(t, active.JWTKey)
	assert.Equal(t, t0.Add(10*24*time.Hour), *active.JWTKey.NotAfter)
	assert.Nil(t, active.NotAfter, "X.509 validity stays X.509's")
	assert.Nil(t, active.JWTKey.RemoveAfter)
	assert.Equal(t, "prepared", authorityByKID(t, local, "k-next").State)

	assert.False(t, peer.JWTIssuer)
	pk := authorityByKID(t, peer, "peer-1")
	assert.Empty(t, pk.State)
	assert.Nil(t, pk.JWTKey)
	assert.Equal(t, "RSA", pk.PublicKeyAlgorithm)
	assert.Equal(t, 2048, pk.KeyBits)
	assert.Equal(t, "RS256/PS256", pk.Algorithm)
	assert.NotEmpty(t, pk.Thumbprint)
}

// Without the CA's records the local JWT authorities are the bundle's,
// without state, and the snapshot makes no claim about JWT-SVIDs.
func TestSnapshotJWTAuthoritiesWithoutRecords(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	f.cfg.JWT = nil
	local := New(f.cfg).Snapshot().TrustDomains[0]
	assert.False(t, local.JWTIssuer)
	a := authorityByKID(t, local, "k-active")
	assert.Empty(t, a.State)
	assert.Nil(t, a.JWTKey)
	assert.Equal(t, "ES256", a.Algorithm, "implied by the curve")

	f.cfg.JWT = fakeJWTKeys{}
	assert.False(t, New(f.cfg).Snapshot().TrustDomains[0].JWTIssuer, "a CA with no JWT keys mints no JWT-SVIDs")
}

// /v1/trust lists the CA's JWT keys beside its roots; the field names are
// an API.
func TestTrustJWTAuthoritiesJSON(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	raw := body(t, do(t, New(f.cfg), http.MethodGet, "/v1/trust"))
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &doc))
	jwts, ok := doc["jwt_authorities"].([]any)
	require.True(t, ok, raw)
	require.Len(t, jwts, 2)
	active := jwts[0].(map[string]any)
	assert.ElementsMatch(t, []string{"kid", "state", "algorithm", "key_type", "curve", "key_bits", "thumbprint", "sha256",
		"created_at", "not_after", "prepared_at", "activated_at"}, keys(active))
	assert.Equal(t, "k-active", active["kid"])
	assert.Equal(t, "active", active["state"])
	assert.Equal(t, "ES256", active["algorithm"])
	assert.Equal(t, "ECDSA", active["key_type"])
	assert.Equal(t, rfc7638(t, &f.active.PublicKey), active["thumbprint"])
	assert.Equal(t, "2026-12-02T12:00:00Z", active["not_after"])
	assert.Equal(t, "prepared", jwts[1].(map[string]any)["state"])

	f.cfg.JWT = nil
	var typed api.Trust
	require.NoError(t, json.Unmarshal([]byte(body(t, do(t, New(f.cfg), http.MethodGet, "/v1/trust"))), &typed))
	require.Len(t, typed.JWTAuthorities, 2, "the bundle's, without records")
	assert.Equal(t, "k-active", typed.JWTAuthorities[0].KID)
	assert.Empty(t, typed.JWTAuthorities[0].State)
	assert.Equal(t, api.SPKISHA256(crypto.PublicKey(f.next.Public())), typed.JWTAuthorities[1].SHA256)
}

func TestTrustWithoutJWTAuthoritiesIsAnEmptyList(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	assert.Contains(t, body(t, do(t, New(f.cfg), http.MethodGet, "/v1/trust")), `"jwt_authorities": []`)
}
