package pemfile

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
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
		certs := checkCertsRoundTrip(t, ParseCertificates, data)
		if certs == nil {
			return
		}
		// What parses strictly parses the same tolerantly.
		found, err := FindCertificates(data)
		require.NoError(t, err)
		assert.Equal(t, certs, found)
	})
}

func FuzzFindCertificates(f *testing.F) {
	certSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkCertsRoundTrip(t, FindCertificates, data)
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

// checkCertsRoundTrip parses data and checks that what parses is not
// empty and parses strictly, unchanged, once re-encoded. It returns the
// certificates, or nil on a refusal.
func checkCertsRoundTrip(t *testing.T, parse func([]byte) ([]*x509.Certificate, error), data []byte) []*x509.Certificate {
	certs, err := parse(data)
	if err != nil {
		assert.Nil(t, certs)
		return nil
	}
	require.NotEmpty(t, certs)
	again, err := ParseCertificates(certsPEM(certs...))
	require.NoError(t, err)
	assert.Equal(t, certs, again)
	return certs
}
