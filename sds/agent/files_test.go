package agent

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testca"
)

func TestParseCredentialSet(t *testing.T) {
	caA, caB := testca.New(t, tdA.Name()), testca.New(t, tdB.Name())
	leaf, key := caA.Issue(t, workload)
	ecDER, err := x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
	require.NoError(t, err)
	ecKey := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER})
	_, otherKey := caA.Issue(t, workload)
	roots := pemCerts(caA.Cert, caB.Cert)

	tests := []struct {
		name    string
		chain   []byte
		key     []byte
		roots   []byte
		wantErr string
	}{
		{"pkcs8", pemCerts(leaf), pemKey(t, key), roots, ""},
		{"sec1 key", pemCerts(leaf), ecKey, roots, ""},
		{"root at the end of the chain is dropped", pemCerts(leaf, caA.Cert), pemKey(t, key), roots, ""},
		{"empty chain", nil, pemKey(t, key), roots, "cert-chain.pem: no PEM certificate"},
		{"key in chain", append(pemCerts(leaf), pemKey(t, key)...), pemKey(t, key), roots, "not a CERTIFICATE"},
		{"leaf not an SVID", pemCerts(caB.Cert, caA.Cert), pemKey(t, key), roots, "cert-chain.pem: leaf"},
		{"no key", pemCerts(leaf), nil, roots, "key.pem: no PEM block"},
		{"two keys", pemCerts(leaf), append(pemKey(t, key), pemKey(t, otherKey)...), roots, "more than one"},
		{"certificate as key", pemCerts(leaf), pemCerts(leaf), roots, "not a private key"},
		{"leaf as root", pemCerts(leaf), pemKey(t, key), pemCerts(caA.Cert, leaf), "not a CA"},
		{"no local root", pemCerts(leaf), pemKey(t, key), pemCerts(caB.Cert), "no root for the trust domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := parseCredentialSet(tt.chain, tt.key, tt.roots)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, workload, set.id)
			require.Len(t, set.chain, 1)
			assert.Equal(t, leaf.Raw, set.chain[0].Raw)
			assert.Len(t, set.roots, 2)
		})
	}
	// A mismatched key parses; the credential cell refuses it (see
	// TestRunFiles).
	_, err = parseCredentialSet(pemCerts(leaf), pemKey(t, otherKey), roots)
	require.NoError(t, err)
}

func FuzzParseCredentialSet(f *testing.F) {
	ca := testca.New(f, tdA.Name())
	leaf, key := ca.Issue(f, workload)
	f.Add(pemCerts(leaf), pemKey(f, key), pemCerts(ca.Cert))
	f.Add(pemCerts(leaf, ca.Cert), pemKey(f, key), pemCerts(ca.Cert, leaf))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte{}, []byte("x"))
	f.Fuzz(func(t *testing.T, chain, key, roots []byte) {
		set, err := parseCredentialSet(chain, key, roots)
		if err != nil {
			return
		}
		if set.id.IsZero() || len(set.chain) == 0 || set.key == nil || len(set.roots[set.id.TrustDomain()]) == 0 {
			t.Fatalf("accepted an incomplete set: %+v", set)
		}
	})
}
