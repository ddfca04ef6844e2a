package bundledoc_test

import (
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func pemOf(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

func TestParsePEM(t *testing.T) {
	a, b := testca.New(t, "example.org"), testca.New(t, "example.org")
	leaf, _ := a.Issue(t, spiffeid.RequireFromPath(td, "/w"))
	foreign := testca.New(t, "other.org")
	notCA := testca.New(t, "example.org", testca.Options{Mutate: func(c *x509.Certificate) { c.IsCA = false }})

	tests := []struct {
		name     string
		doc      []byte
		roots    int
		warnings []string
		err      string
	}{
		{"two roots", pemOf(a.Cert, b.Cert), 2, nil, ""},
		{"leading whitespace", append([]byte("\n  "), pemOf(a.Cert)...), 1, nil, ""},
		{"duplicate ignored", pemOf(a.Cert, a.Cert), 1, []string{"PEM certificate 2 repeats an earlier one; ignored"}, ""},
		{"names another trust domain", pemOf(foreign.Cert), 1, []string{`PEM certificate 1: x5c certificate names trust domain "other.org" but the bundle is for "example.org"`}, ""},
		{"leaf refused", pemOf(a.Cert, leaf), 0, nil, "bundledoc: PEM certificate 2 (" + leaf.Subject.String() + "): x5c certificate is not a CA (basicConstraints CA=true required)"},
		{"not a CA refused", pemOf(notCA.Cert), 0, nil, "x5c certificate is not a CA"},
		{"private key refused", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}), 0, nil, `unexpected PEM block "PRIVATE KEY"`},
		{"garbage", []byte("-----BEGIN CERTIFICATE-----\n!!\n"), 0, nil, "bundledoc: PEM:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.True(t, bundledoc.IsPEM(tt.doc))
			got, warnings, err := bundledoc.ParseAny(td, tt.doc)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Len(t, got.X509Authorities(), tt.roots)
			assert.Equal(t, td, got.TrustDomain())
			var msgs []string
			for _, w := range warnings {
				msgs = append(msgs, w.String())
			}
			assert.Equal(t, tt.warnings, msgs)
		})
	}
}

func TestParseAnyTakesJSON(t *testing.T) {
	a := testca.New(t, "example.org")
	doc, err := bundledoc.Marshal(a.Bundle())
	require.NoError(t, err)
	assert.False(t, bundledoc.IsPEM(doc))
	b, _, err := bundledoc.ParseAny(td, doc)
	require.NoError(t, err)
	assert.True(t, b.Equal(a.Bundle()))
}

// openssl x509 -text output: text, then the PEM block; refused with what
// to do, not a JSON syntax error.
func TestParseAnyTextBeforePEM(t *testing.T) {
	a := testca.New(t, "example.org")
	doc := append([]byte("Certificate:\n    Data:\n        Version: 3 (0x2)\n"), pemOf(a.Cert)...)
	_, _, err := bundledoc.ParseAny(td, doc)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "text before the first -----BEGIN line: keep only the PEM CERTIFICATE blocks")
}

func FuzzParsePEM(f *testing.F) {
	a := testca.New(f, "example.org")
	f.Add(pemOf(a.Cert))
	f.Add(pemOf(a.Cert, a.Cert))
	f.Add(pemOf(testca.New(f, "other.org").Cert))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, doc []byte) {
		b, _, err := bundledoc.ParsePEM(td, doc)
		if err != nil {
			assert.Nil(t, b)
			return
		}
		// Whatever is accepted marshals as a bundle document that parses
		// back to the same roots.
		out, err := bundledoc.Marshal(b)
		require.NoError(t, err)
		again, _, err := bundledoc.Parse(td, out)
		require.NoError(t, err)
		assert.True(t, b.Equal(again))
	})
}
