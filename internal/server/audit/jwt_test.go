package audit

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func jwtKey(t *testing.T, kid string, pub crypto.PublicKey) api.Authority {
	t.Helper()
	return api.KeyAuthority(api.KindJWT, kid, pub)
}

func ecPub(t *testing.T, c elliptic.Curve) crypto.PublicKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	require.NoError(t, err)
	return k.Public()
}

func rsaPub(t *testing.T, bits int) crypto.PublicKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, bits)
	require.NoError(t, err)
	return k.Public()
}

// ownKey is one of the local CA's JWT keys in state, created life ago
// before now's end and expiring left after now.
func ownKey(t *testing.T, kid, state string, life, left time.Duration) api.Authority {
	t.Helper()
	a := jwtKey(t, kid, ecPub(t, elliptic.P256()))
	created, na := now.Add(left-life), now.Add(left)
	a.State, a.JWTKey = state, &api.JWTKey{CreatedAt: &created, NotAfter: &na}
	return a
}

func issuer(auths ...api.Authority) api.TrustDomain {
	td := local(auths...)
	td.JWTIssuer = true
	return td
}

func TestJWTFindings(t *testing.T) {
	x509Root := root(t, "east.example", testca.Options{})
	ed, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	x25519, err := ecdh.X25519().GenerateKey(rand.Reader)
	require.NoError(t, err)
	const month = 30 * 24 * time.Hour
	w := func(code, td string) found { return found{api.SeverityWarning, code, td} }
	c := func(code, td string) found { return found{api.SeverityCritical, code, td} }
	cases := []struct {
		name string
		tds  []api.TrustDomain
		want []found
	}{
		{"healthy: ES256, RS 2048, Ed25519, P-384",
			[]api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", month, 20*24*time.Hour)),
				peer("west.example", okFed("https://w/"), jwtKey(t, "r", rsaPub(t, 2048)), jwtKey(t, "e", ed), jwtKey(t, "p", ecPub(t, elliptic.P384())))},
			[]found{}},
		{"a federated peer without JWT authorities is fine",
			[]api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", month, 20*24*time.Hour)),
				peer("west.example", okFed("https://w/"), root(t, "west.example", testca.Options{}))},
			[]found{}},
		{"peer RSA 1024", []api.TrustDomain{peer("west.example", okFed("https://w/"), jwtKey(t, "r", rsaPub(t, 1024)))},
			[]found{c(CodeJWTWeakKey, "west.example")}},
		{"peer P-224", []api.TrustDomain{peer("west.example", okFed("https://w/"), jwtKey(t, "p", ecPub(t, elliptic.P224())))},
			[]found{c(CodeJWTWeakKey, "west.example")}},
		{"peer X25519: unknown key type", []api.TrustDomain{peer("west.example", okFed("https://w/"), jwtKey(t, "x", x25519.PublicKey()))},
			[]found{w(CodeJWTUnknownKey, "west.example")}},
		{"own RSA 1024", []api.TrustDomain{issuer(x509Root, jwtKey(t, "a", rsaPub(t, 1024)), ownKey(t, "b", "active", month, 20*24*time.Hour))},
			[]found{c(CodeJWTWeakKey, "east.example")}},
		{"no active key", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "retired", month, 2*24*time.Hour))},
			[]found{c(CodeJWTNoActiveKey, "east.example")}},
		{"no JWT key at all", []api.TrustDomain{issuer(x509Root)},
			[]found{c(CodeJWTNoActiveKey, "east.example")}},
		{"only a prepared key (an upgraded CA's first)", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "prepared", month, month))},
			[]found{w(CodeJWTNoActiveKey, "east.example")}},
		{"not an issuer: not judged", []api.TrustDomain{local(x509Root)}, []found{}},
		{"active key past not_after", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", month, -time.Hour), ownKey(t, "b", "prepared", month, month))},
			[]found{c(CodeJWTKeyExpired, "east.example")}},
		{"a quarter of its life left, no successor", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", month, 7*24*time.Hour))},
			[]found{w(CodeJWTKeyExpiring, "east.example")}},
		{"an eighth of its life left, no successor", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", month, 3*24*time.Hour))},
			[]found{c(CodeJWTKeyExpiring, "east.example")}},
		{"a short-lived key by its own life", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", 8*time.Hour, 90*time.Minute))},
			[]found{w(CodeJWTKeyExpiring, "east.example")}},
		{"an eighth left with a prepared successor", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", month, 3*24*time.Hour), ownKey(t, "b", "prepared", month, month))},
			[]found{}},
		{"30-day key 20 days in: not late", []api.TrustDomain{issuer(x509Root, ownKey(t, "a", "active", month, 10*24*time.Hour))},
			[]found{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", TrustDomains: tc.tds})
			assert.Equal(t, tc.want, summary(fs))
			for _, f := range fs {
				assert.NotEmpty(t, f.Message)
				assert.NotEmpty(t, f.Fix, "every finding says how to fix it")
			}
		})
	}
}

// JWT findings judge the key the snapshot carries, not what the server
// says of it; without either, a key is not judged.
func TestJWTFindingsReadTheKey(t *testing.T) {
	a := jwtKey(t, "r", rsaPub(t, 1024))
	a.KeyBits = 4096
	fs := Findings(api.Snapshot{Time: now, TrustDomains: []api.TrustDomain{peer("west.example", okFed("https://w/"), a)}})
	assert.Equal(t, []found{{api.SeverityCritical, CodeJWTWeakKey, "west.example"}}, summary(fs))
	assert.Contains(t, fs[0].Message, `"r"`)
	assert.Contains(t, fs[0].Message, "1024-bit")

	a.PublicKey = []byte("garbage")
	fs = Findings(api.Snapshot{Time: now, TrustDomains: []api.TrustDomain{peer("west.example", okFed("https://w/"), a)}})
	assert.Equal(t, []found{{api.SeverityCritical, CodeUnparsableAuthor, "west.example"}}, summary(fs))

	old := api.Authority{Kind: api.KindJWT, KeyID: "k", SHA256: "aa"}
	fs = Findings(api.Snapshot{Time: now, TrustDomains: []api.TrustDomain{peer("west.example", okFed("https://w/"), old)}})
	assert.Empty(t, fs, "a server that predates JWT details")
}

// An expired active key is refused by the CA: the finding says minting
// has stopped and how it resumes, with or without a prepared successor.
func TestJWTKeyExpiredFindingSaysMintingStopped(t *testing.T) {
	expired := ownKey(t, "a", "active", 30*24*time.Hour, -time.Hour)
	cases := []struct {
		name string
		tds  []api.TrustDomain
		fix  string
	}{
		{"no successor", []api.TrustDomain{issuer(expired)}, "trustbridge ca rotate --jwt"},
		{"a prepared successor", []api.TrustDomain{issuer(expired, ownKey(t, "b", "prepared", 30*24*time.Hour, 29*24*time.Hour))}, "a successor is prepared"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", TrustDomains: tc.tds})
			require.Len(t, fs, 1)
			assert.Equal(t, CodeJWTKeyExpired, fs[0].Code)
			assert.Contains(t, fs[0].Message, "minting has stopped")
			assert.NotContains(t, fs[0].Message, "still signs")
			assert.Contains(t, fs[0].Fix, tc.fix)
		})
	}
}
