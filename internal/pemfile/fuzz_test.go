package pemfile

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testca"
)

func certSeeds(f *testing.F) {
	a := testca.New(f, "example.org").Cert
	f.Add(certsPEM(a))
	f.Add(certsPEM(a, a))
	f.Add(append([]byte("# comment\n"), certsPEM(a)...))
	f.Add(append(certsPEM(a), "junk"...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n!!\n-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"A": "b"}, Bytes: a.Raw}))
	f.Add(pkcs8(f, testca.NewKey(f, testca.ECP256)))
	f.Add([]byte{})
}

func FuzzParseCertificates(f *testing.F) {
	certSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCertificates(data)
		if err != nil {
			assert.Nil(t, certs)
			return
		}
		require.NotEmpty(t, certs)
		// What parses strictly parses the same tolerantly and round-trips.
		found, err := FindCertificates(data)
		require.NoError(t, err)
		assert.Equal(t, certs, found)
		again, err := ParseCertificates(encode(certs))
		require.NoError(t, err)
		assert.Equal(t, certs, again)
	})
}

func FuzzFindCertificates(f *testing.F) {
	certSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := FindCertificates(data)
		if err != nil {
			assert.Nil(t, certs)
			return
		}
		require.NotEmpty(t, certs)
		again, err := ParseCertificates(encode(certs))
		require.NoError(t, err)
		assert.Equal(t, certs, again)
	})
}

func FuzzParsePrivateKey(f *testing.F) {
	ec := testca.NewKey(f, testca.ECP256)
	f.Add(pkcs8(f, ec))
	f.Add(pkcs8(f, testca.NewKey(f, testca.Ed25519)))
	f.Add(pemBlock("RSA PRIVATE KEY", []byte{0x30, 0}))
	f.Add(pemBlock("EC PRIVATE KEY", []byte{0x30, 0}))
	f.Add(append(pkcs8(f, ec), pkcs8(f, ec)...))
	f.Add(certsPEM(testca.New(f, "example.org").Cert))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		key, err := ParsePrivateKey(data)
		if err != nil {
			assert.Nil(t, key)
			return
		}
		require.NotNil(t, key.Public())
		der, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(t, err)
		again, err := ParsePrivateKey(pemBlock("PRIVATE KEY", der))
		require.NoError(t, err)
		assert.True(t, again.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()))
	})
}

func encode(certs []*x509.Certificate) []byte {
	return certsPEM(certs...)
}
