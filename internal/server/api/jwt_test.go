package api

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeyAuthority(t *testing.T) {
	ec := func(c elliptic.Curve) crypto.PublicKey {
		k, err := ecdsa.GenerateKey(c, rand.Reader)
		require.NoError(t, err)
		return k.Public()
	}
	r, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	ed, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	x, err := ecdh.X25519().GenerateKey(rand.Reader)
	require.NoError(t, err)
	cases := []struct {
		name            string
		pub             crypto.PublicKey
		keyAlg, curve   string
		bits            int
		alg             string
		hasDER, hasThmb bool
	}{
		{"P-256", ec(elliptic.P256()), "ECDSA", "P-256", 256, "ES256", true, true},
		{"P-384", ec(elliptic.P384()), "ECDSA", "P-384", 384, "ES384", true, true},
		{"P-521", ec(elliptic.P521()), "ECDSA", "P-521", 521, "ES512", true, true},
		{"P-224", ec(elliptic.P224()), "ECDSA", "P-224", 224, "", true, false},
		{"RSA 2048", r.Public(), "RSA", "", 2048, "RS256/PS256", true, true},
		{"Ed25519", ed, "Ed25519", "", 256, "EdDSA", true, true},
		{"X25519", x.PublicKey(), "*ecdh.PublicKey", "", 0, "", true, false},
		{"not a key", struct{}{}, "struct {}", "", 0, "", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := KeyAuthority(KindJWT, "kid-1", tc.pub)
			assert.Equal(t, KindJWT, a.Kind)
			assert.Equal(t, "kid-1", a.KeyID)
			assert.Equal(t, tc.keyAlg, a.PublicKeyAlgorithm)
			assert.Equal(t, tc.curve, a.Curve)
			assert.Equal(t, tc.bits, a.KeyBits)
			assert.Equal(t, tc.alg, a.Algorithm)
			assert.Equal(t, tc.hasDER, len(a.PublicKey) > 0)
			assert.Equal(t, tc.hasThmb, a.Thumbprint != "", a.Thumbprint)
			assert.Equal(t, SPKISHA256(tc.pub), a.SHA256)
			assert.NotEmpty(t, a.SHA256)
		})
	}
}
