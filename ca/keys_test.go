package ca

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"math/big"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestParseKeyType(t *testing.T) {
	for _, kt := range []KeyType{KeyECP256, KeyECP384, KeyRSA2048, KeyRSA3072, KeyRSA4096} {
		t.Run(string(kt), func(t *testing.T) {
			got, err := ParseKeyType(string(kt))
			require.NoError(t, err)
			assert.Equal(t, kt, got)
		})
	}
	for _, s := range []string{"", "EC-P256", "ec-p256 ", "ec-p224", "rsa-1024", "ed25519", "rsa"} {
		t.Run("refuses "+s, func(t *testing.T) {
			_, err := ParseKeyType(s)
			require.Error(t, err)
			assert.EqualError(t, err, `ca: unknown key type "`+s+`" (valid: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096)`)
		})
	}
}

func TestGenerateKey(t *testing.T) {
	wantEC := func(c elliptic.Curve) func(*testing.T, crypto.Signer) {
		return func(t *testing.T, k crypto.Signer) {
			ec, ok := k.(*ecdsa.PrivateKey)
			require.True(t, ok, "%T", k)
			assert.Equal(t, c, ec.Curve)
		}
	}
	wantRSA := func(bits int) func(*testing.T, crypto.Signer) {
		return func(t *testing.T, k crypto.Signer) {
			r, ok := k.(*rsa.PrivateKey)
			require.True(t, ok, "%T", k)
			assert.Equal(t, bits, r.N.BitLen())
		}
	}
	tests := []struct {
		kt    KeyType
		check func(t *testing.T, k crypto.Signer)
	}{
		{KeyECP256, wantEC(elliptic.P256())},
		{KeyECP384, wantEC(elliptic.P384())},
		{KeyRSA2048, wantRSA(2048)},
		{KeyRSA3072, wantRSA(3072)},
		{KeyRSA4096, wantRSA(4096)},
	}
	for _, tt := range tests {
		t.Run(string(tt.kt), func(t *testing.T) {
			if testing.Short() && tt.kt == KeyRSA4096 {
				t.Skip("slow key generation")
			}
			t.Parallel()
			k, err := GenerateKey(tt.kt)
			require.NoError(t, err)
			tt.check(t, k)
			// What the CA generates for itself it would accept from a
			// workload too.
			assert.NoError(t, checkPublicKey(k.Public()))
		})
	}
	t.Run("unknown", func(t *testing.T) {
		k, err := GenerateKey("ec-p224")
		assert.Nil(t, k)
		assert.EqualError(t, err, `ca: unknown key type "ec-p224" (valid: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096)`)
	})
}

func TestCheckPublicKey(t *testing.T) {
	// RSA moduli of a given length; checkPublicKey looks at the length and
	// exponent only, so they need not be real keys.
	modulus := func(bits int) *big.Int { return new(big.Int).Lsh(big.NewInt(1), uint(bits-1)) }
	x25519, err := ecdh.X25519().GenerateKey(rand.Reader)
	require.NoError(t, err)
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)
	// A look-alike of P-256: same name and parameters, different identity.
	fakeP256 := *elliptic.P256().Params()

	tests := []struct {
		name string
		pub  crypto.PublicKey
		want string // empty: accepted
	}{
		{"ec-p256", testca.NewKey(t, testca.ECP256).Public(), ""},
		{"ec-p384", testca.NewKey(t, testca.ECP384).Public(), ""},
		{"ec-p521", testca.NewKey(t, testca.ECP521).Public(), ""},
		{"ed25519", testca.NewKey(t, testca.Ed25519).Public(), ""},
		{"rsa-2048", testca.NewKey(t, testca.RSA2048).Public(), ""},
		{"rsa-8192 synthetic", &rsa.PublicKey{N: modulus(8192), E: 65537}, ""},
		{"rsa e=3", &rsa.PublicKey{N: modulus(2048), E: 3}, ""},

		{"ec-p224", p224.Public(), "ecdsa curve P-224 not allowed"},
		{"ec look-alike curve", &ecdsa.PublicKey{Curve: &fakeP256}, "ecdsa curve P-256 not allowed"},
		{"ec nil curve", &ecdsa.PublicKey{}, "empty ecdsa key"},
		{"ec nil", (*ecdsa.PublicKey)(nil), "empty ecdsa key"},
		{"rsa-1024", testca.NewKey(t, testca.RSA1024).Public(), "rsa key of 1024 bits not allowed"},
		{"rsa-2047", &rsa.PublicKey{N: modulus(2047), E: 65537}, "rsa key of 2047 bits not allowed (want 2048 to 8192)"},
		{"rsa-8193", &rsa.PublicKey{N: modulus(8193), E: 65537}, "rsa key of 8193 bits not allowed"},
		{"rsa e=1", &rsa.PublicKey{N: modulus(2048), E: 1}, "rsa public exponent 1 not allowed"},
		{"rsa even e", &rsa.PublicKey{N: modulus(2048), E: 65536}, "rsa public exponent 65536 not allowed"},
		{"rsa nil modulus", &rsa.PublicKey{E: 65537}, "empty rsa key"},
		{"rsa nil", (*rsa.PublicKey)(nil), "empty rsa key"},
		{"ed25519 short", ed25519.PublicKey(make([]byte, 31)), "ed25519 key of 31 bytes not allowed"},
		{"x25519", x25519.PublicKey(), "key type *ecdh.PublicKey not allowed"},
		{"nil", nil, "key type <nil> not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkPublicKey(tt.pub)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
