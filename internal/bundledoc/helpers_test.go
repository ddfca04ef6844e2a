package bundledoc_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"math/big"
	"testing"

	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"
)

// obj is a JSON object under construction.
type obj = map[string]any

// jwk renders a public key as a JWK element, the way a producer would.
func jwk(t testing.TB, pub crypto.PublicKey, use, kid string, certs ...*x509.Certificate) obj {
	t.Helper()
	data, err := jose.JSONWebKey{Key: pub, Use: use, KeyID: kid, Certificates: certs}.MarshalJSON()
	require.NoError(t, err)
	var m obj
	require.NoError(t, json.Unmarshal(data, &m))
	return m
}

// x509Element is the JWK for a root as it appears in a bundle.
func x509Element(t testing.TB, cert *x509.Certificate) obj {
	return jwk(t, cert.PublicKey, "x509-svid", "", cert)
}

func with(m obj, kv ...any) obj {
	out := obj{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
			continue
		}
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func docOf(keys ...obj) obj {
	list := make([]any, len(keys))
	for i, k := range keys {
		list[i] = k
	}
	return obj{"keys": list}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	return data
}

// fakeRSA returns an RSA public key with a modulus of exactly bits bits.
// It is not a usable key, only the shape the size checks look at, so tests
// need not generate 16384-bit keys.
func fakeRSA(t testing.TB, bits int) *rsa.PublicKey {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), uint(bits-1)))
	require.NoError(t, err)
	n.SetBit(n, bits-1, 1)
	n.SetBit(n, 0, 1)
	return &rsa.PublicKey{N: n, E: 65537}
}
