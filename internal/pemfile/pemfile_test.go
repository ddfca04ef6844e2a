package pemfile

import (
	"bytes"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func certsPEM(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pemBlock("CERTIFICATE", c.Raw)...)
	}
	return out
}

func pkcs8(tb testing.TB, key any) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(tb, err)
	return pemBlock("PRIVATE KEY", der)
}

func TestParseCertificates(t *testing.T) {
	a := testca.New(t, "example.org").Cert
	b := testca.New(t, "other.example").Cert
	key := pkcs8(t, testca.NewKey(t, testca.ECP256))
	withHeaders := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: a.Raw})
	checkCertCases(t, ParseCertificates, []certCase{
		{name: "one", data: certsPEM(a), want: []*x509.Certificate{a}},
		{name: "two in order", data: certsPEM(a, b), want: []*x509.Certificate{a, b}},
		{name: "whitespace around and between", data: append(append([]byte(" \r\n\t"), append(certsPEM(a), "\n\n"...)...), certsPEM(b)...), want: []*x509.Certificate{a, b}},
		{name: "empty", err: "no PEM certificate: the input is empty"},
		{name: "whitespace only", data: []byte("\n \n"), err: "no PEM block, only whitespace"},
		{name: "leading text", data: append([]byte("subject=CN=a\n"), certsPEM(a)...), err: "unexpected data at byte 0"},
		{name: "trailing text", data: append(certsPEM(a), "junk\n"...), err: "unexpected data at byte"},
		{name: "malformed block before a good one", data: append([]byte("-----BEGIN CERTIFICATE-----\n!!\n"), certsPEM(a)...), err: "unexpected data at byte 0"},
		{name: "truncated", data: certsPEM(a)[:100], err: "unexpected data at byte 0"},
		{name: "key among certificates", data: append(certsPEM(a), key...), err: `block 2: unexpected PEM block "PRIVATE KEY", want CERTIFICATE`},
		{name: "headers", data: withHeaders, err: "block 1: PEM headers are not supported"},
		{name: "bad DER", data: pemBlock("CERTIFICATE", []byte{0x30, 0}), err: "certificate 1:"},
		{name: "too large", data: make([]byte, MaxSize+1), err: "at most 1048576 are accepted"},
		{name: "too many", data: bytes.Repeat(certsPEM(a), MaxCertificates+1), err: "more than 1000 PEM blocks"},
	})
}

type certCase struct {
	name string
	data []byte
	want []*x509.Certificate
	err  string
}

func checkCertCases(t *testing.T, parse func([]byte) ([]*x509.Certificate, error), tests []certCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse(tt.data)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseCertificatesAtTheLimit(t *testing.T) {
	a := testca.New(t, "example.org").Cert
	got, err := ParseCertificates(bytes.Repeat(certsPEM(a), MaxCertificates))
	require.NoError(t, err)
	assert.Len(t, got, MaxCertificates)
}

func TestParsePrivateKey(t *testing.T) {
	ec := testca.NewKey(t, testca.ECP256).(*ecdsa.PrivateKey)
	rsaKey := testca.NewKey(t, testca.RSA2048).(*rsa.PrivateKey)
	ed := testca.NewKey(t, testca.Ed25519)
	sec1, err := x509.MarshalECPrivateKey(ec)
	require.NoError(t, err)
	x25519, err := ecdh.X25519().GenerateKey(rand.Reader)
	require.NoError(t, err)
	cert := certsPEM(testca.New(t, "example.org").Cert)

	good := []struct {
		name string
		data []byte
		want crypto.Signer
	}{
		{"PKCS #8 EC", pkcs8(t, ec), ec},
		{"PKCS #8 RSA", pkcs8(t, rsaKey), rsaKey},
		{"PKCS #8 Ed25519", pkcs8(t, ed), ed},
		{"SEC 1", pemBlock("EC PRIVATE KEY", sec1), ec},
		{"PKCS #1", pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey)), rsaKey},
		{"surrounding whitespace", append(append([]byte("\n "), pkcs8(t, ec)...), "\r\n"...), ec},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePrivateKey(tt.data)
			require.NoError(t, err)
			assert.True(t, tt.want.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(got.Public()))
		})
	}

	bad := []struct {
		name string
		data []byte
		err  string
	}{
		{"empty", nil, "no PEM block"},
		{"two keys", append(pkcs8(t, ec), pkcs8(t, ec)...), "holds 2 PEM blocks, want exactly 1 private key (more than one"},
		{"certificate", cert, `unexpected PEM block "CERTIFICATE": not a private key`},
		{"encrypted PKCS #8", pemBlock("ENCRYPTED PRIVATE KEY", []byte{1}), `unexpected PEM block "ENCRYPTED PRIVATE KEY"`},
		{"legacy encrypted", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: sec1}), "block 1: PEM headers are not supported"},
		{"leading text", append([]byte("key:\n"), pkcs8(t, ec)...), "unexpected data at byte 0"},
		{"trailing text", append(pkcs8(t, ec), "x"...), "unexpected data at byte"},
		{"bad DER", pemBlock("EC PRIVATE KEY", []byte{0x30, 0}), "EC PRIVATE KEY block:"},
		{"key that cannot sign", pkcs8(t, x25519), "*ecdh.PrivateKey keys cannot sign"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePrivateKey(tt.data)
			assert.ErrorContains(t, err, tt.err)
			assert.Nil(t, got)
		})
	}
}

func TestFindCertificates(t *testing.T) {
	a := testca.New(t, "example.org").Cert
	b := testca.New(t, "other.example").Cert
	key := pemBlock("PRIVATE KEY", []byte("x"))
	checkCertCases(t, FindCertificates, []certCase{
		{name: "two", data: certsPEM(a, b), want: []*x509.Certificate{a, b}},
		{name: "comments and other blocks skipped", data: append(append([]byte("# Root A\n"), key...), certsPEM(b)...), want: []*x509.Certificate{b}},
		{name: "none", data: key, err: "no PEM certificates"},
		{name: "empty", err: "no PEM certificates"},
		{name: "bad DER", data: pemBlock("CERTIFICATE", []byte("nope")), err: "certificate 0"},
		{name: "too large", data: make([]byte, MaxSize+1), err: "at most 1048576 are accepted"},
		{name: "too many", data: bytes.Repeat(certsPEM(a), MaxCertificates+1), err: "more than 1000 certificates"},
	})
}

// Every refusal says what is wrong without quoting key material.
func TestParsePrivateKeyDoesNotQuoteTheKey(t *testing.T) {
	data := append(pkcs8(t, testca.NewKey(t, testca.ECP256)), "trailing"...)
	_, err := ParsePrivateKey(data)
	require.Error(t, err)
	body := strings.Split(string(data), "\n")[1]
	assert.NotContains(t, err.Error(), body)
}
