package federation

import (
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// A PEM root (Istio's root-cert.pem) is a bootstrap bundle wherever a
// bundle file is: the fourth tuple field and trustDomainBundleFile; it is
// held to the rules a bundle document is (issue 22).
func TestBootstrapBundleFromPEM(t *testing.T) {
	bar := testca.New(t, "bar.example")
	leaf, _ := bar.Issue(t, id("spiffe://bar.example/w"))
	other := testca.New(t, "other.example")
	files := map[string][]byte{
		"root.pem":    testca.PEM(bar.Cert),
		"leaf.pem":    testca.PEM(bar.Cert, leaf),
		"foreign.pem": testca.PEM(other.Cert),
	}
	read := func(p string) ([]byte, error) { return files[p], nil }
	yaml := func(file string) []byte {
		return []byte("federation:\n  - trustDomain: bar.example\n    bundleEndpointURL: https://bar.example/\n" +
			"    bundleEndpointProfile: {type: https_spiffe, endpointSPIFFEID: spiffe://bar.example/s}\n    trustDomainBundleFile: " + file + "\n")
	}
	tests := []struct {
		file string
		err  string
	}{
		{"root.pem", ""},
		{"leaf.pem", "x5c certificate is not a CA"},
		{"foreign.pem", `bundle is for another trust domain: PEM certificate 1: x5c certificate names trust domain "other.example"`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			for name, parse := range map[string]func() (*Config, error){
				"tuple": func() (*Config, error) {
					return ParseEndpointsConfig("bar.example|https://bar.example/|spiffe://bar.example/s|"+tt.file, read)
				},
				"file": func() (*Config, error) { return ParseConfig(yaml(tt.file), read) },
			} {
				cfg, err := parse()
				if tt.err != "" {
					assert.ErrorContains(t, err, tt.err, name)
					continue
				}
				require.NoError(t, err, name)
				require.Len(t, cfg.Endpoints, 1)
				b := cfg.Endpoints[0].BootstrapBundle
				require.NotNil(t, b, name)
				assert.Equal(t, []*x509.Certificate{bar.Cert}, b.X509Authorities(), name)
				assert.NoError(t, CheckFirstFetch(cfg.Endpoints[0], nil), name)
			}
		})
	}
}
