package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// Issuer flags that would serve an issuer relying parties cannot use, or
// one that is not ours to serve, are refused before the data directory
// holds anything: a first start (--init) with them leaves no CA behind.
// config check finds the same problems.
func TestIssuerFlagsRefusedBeforeState(t *testing.T) {
	certFile, keyFile, _ := writeIPCert(t)
	relayFile := filepath.Join(t.TempDir(), "relay.json")
	servertest.WriteBundleDoc(t, relayFile, testca.New(t, "relay.example"))
	web := func(b BundleConfig) BundleConfig {
		b.Listen, b.Path, b.Profile, b.TLSCert, b.TLSKey, b.ServeOthers = "127.0.0.1:0", "/", ProfileWeb, certFile, keyFile, true
		return b
	}
	tests := []struct {
		name   string
		issuer string
		b      BundleConfig
		want   string
	}{
		{"https_spiffe", "https://127.0.0.1/oidc", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE},
			`--jwt-issuer "https://127.0.0.1/oidc" needs --bundle-profile https_web`},
		{"trailing slash", "https://127.0.0.1/", web(BundleConfig{}), `--jwt-issuer: issuer "https://127.0.0.1/": ends with "/"`},
		{"host not in the certificate", "https://oidc.example.com", web(BundleConfig{}),
			"host oidc.example.com is not covered by --bundle-tls-cert (valid for 127.0.0.1)"},
		{"host not an ACME domain", "https://oidc.example.com", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileWeb,
			ACMEDomains: []string{"bundle.example.com"}, acmeTOS: true}, "host oidc.example.com is not among the --acme-domain names (bundle.example.com)"},
		{"relay of a trust domain not relayed", "", web(BundleConfig{RelayIssuers: []string{"peer.example=https://127.0.0.1/peer"}}),
			"peer.example is not relayed from a bundle file (--bundle-file peer.example=FILE)"},
		{"relay of our own trust domain", "", web(BundleConfig{RelayIssuers: []string{"example.org=https://127.0.0.1/x"}}),
			"example.org is our own trust domain; its issuer is --jwt-issuer"},
		{"relay without TD=", "", web(BundleConfig{RelayIssuers: []string{"https://127.0.0.1/x"}}), "want TD=URL"},
		{"relay on https_spiffe", "", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true,
			Files: []string{"relay.example=" + relayFile}, RelayIssuers: []string{"relay.example=https://127.0.0.1/relay"}}, "needs --bundle-profile https_web"},
		{"two issuers for one trust domain", "", web(BundleConfig{Files: []string{"relay.example=" + relayFile},
			RelayIssuers: []string{"relay.example=https://127.0.0.1/a", "relay.example=https://127.0.0.1/b"}}), "relay.example already has issuer https://127.0.0.1/a"},
		{"issuer under /bundles/", "https://127.0.0.1/bundles", web(BundleConfig{}), `issuer "https://127.0.0.1/bundles": /bundles/.well-known/openid-configuration: collides with the /bundle-map`},
		{"bundle path is the JWKS's", "https://127.0.0.1", func() BundleConfig { b := web(BundleConfig{}); b.Path = "/keys"; return b }(),
			`issuer "https://127.0.0.1": /keys: is the local bundle's path (--bundle-path)`},
		{"two issuers on one path", "https://127.0.0.1/x", web(BundleConfig{Files: []string{"relay.example=" + relayFile},
			RelayIssuers: []string{"relay.example=https://127.0.0.1/x"}}), `is already issuer "https://127.0.0.1/x"'s`},
		{"relay with the endpoint off", "", BundleConfig{RelayIssuers: []string{"relay.example=https://127.0.0.1/relay"}}, "the bundle endpoint is off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			o := firstStart(dataDir)
			o.Bundle, o.JWT.Issuer = tt.b, tt.issuer
			err := runFirstStart(o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			_, statErr := os.Stat(filepath.Join(dataDir, "ca"))
			assert.True(t, os.IsNotExist(statErr), "no CA state was created")

			problems := CheckConfig(o)
			var found bool
			for _, p := range problems {
				found = found || strings.Contains(p.Error(), tt.want)
			}
			assert.True(t, found, "config check: %v", problems)
		})
	}
}
