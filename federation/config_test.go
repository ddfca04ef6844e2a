package federation

import (
	"encoding/json"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// bundleJSON returns b as a bundle document.
func bundleJSON(t testing.TB, b *spiffebundle.Bundle) string {
	t.Helper()
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	return string(doc)
}

// jwtOnlyBundle returns a bundle document for trustDomain with a JWT
// authority and no X.509 authority.
func jwtOnlyBundle(t testing.TB, trustDomain string) string {
	t.Helper()
	b := spiffebundle.New(td(trustDomain))
	require.NoError(t, b.AddJWTAuthority("kid-1", testca.NewKey(t, testca.ECP256).Public()))
	return bundleJSON(t, b)
}

// withIgnoredKey appends a key element the spec says to ignore.
func withIgnoredKey(t testing.TB, doc string) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(doc), &m))
	m["keys"] = append(m["keys"].([]any), map[string]any{"kty": "AKP", "use": "x509-svid", "alg": "ML-DSA-44", "pub": "AAAA"})
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return string(out)
}

// files is a readFile backed by a map.
func files(m map[string]string) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		s, ok := m[p]
		if !ok {
			return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
		}
		return []byte(s), nil
	}
}

func TestParseConfigAccepts(t *testing.T) {
	ca := testca.New(t, "example.org")
	caDoc := bundleJSON(t, ca.Bundle())
	jwtOnly := jwtOnlyBundle(t, "prod.example.org")

	tests := []struct {
		name     string
		yaml     string
		readFile func(string) ([]byte, error)
		check    func(t *testing.T, cfg *Config)
	}{
		{name: "empty file", yaml: ""},
		{name: "comments only", yaml: "# nothing yet\n"},
		{name: "empty document", yaml: "---\n"},
		{name: "null document", yaml: "~\n"},
		{name: "null federation", yaml: "federation:\n"},
		{name: "empty federation", yaml: "federation: []\n"},
		{name: "https_web", yaml: `
federation:
  - trustDomain: example.org
    bundleEndpointURL: https://example.org/bundle
    bundleEndpointProfile:
      type: https_web
`, check: func(t *testing.T, cfg *Config) {
			assert.Equal(t, []Endpoint{web(t, "example.org", "https://example.org/bundle")}, cfg.Endpoints)
		}},
		{name: "https_spiffe with everything inline", yaml: `
federation:
  - trustDomain: example.org
    bundleEndpointURL: "HTTPS://example.org:8443/?x=1"
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://example.org/spire/server
    trustDomainBundle: |
      ` + caDoc + `
    refresh: {min: 30s, max: 1h}
  - bundleEndpointProfile: {type: https_web}
    bundleEndpointURL: https://bar.example/
    trustDomain: bar.example
`, check: func(t *testing.T, cfg *Config) {
			want := spiffe(t, "example.org", "https://example.org:8443/?x=1", "spiffe://example.org/spire/server")
			want.BootstrapBundle = ca.Bundle()
			want.Refresh = Refresh{Min: 30 * time.Second, Max: time.Hour}
			require.Len(t, cfg.Endpoints, 2)
			assert.Equal(t, want, cfg.Endpoints[0])
			assert.True(t, want.BootstrapBundle.Equal(cfg.Endpoints[0].BootstrapBundle))
			assert.Equal(t, web(t, "bar.example", "https://bar.example/"), cfg.Endpoints[1])
			assert.Empty(t, cfg.Warnings)
		}},
		{name: "bundle file", yaml: `
federation:
  - trustDomain: example.org
    bundleEndpointURL: https://example.org/
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://example.org/spire/server
    trustDomainBundleFile: bundles/example.json
`, readFile: files(map[string]string{"bundles/example.json": caDoc}), check: func(t *testing.T, cfg *Config) {
			require.Len(t, cfg.Endpoints, 1)
			ep := cfg.Endpoints[0]
			assert.Equal(t, "bundles/example.json", ep.BootstrapBundleFile)
			require.NotNil(t, ep.BootstrapBundle)
			assert.True(t, ca.Bundle().Equal(ep.BootstrapBundle))
		}},
		{name: "refresh min only", yaml: `
federation:
  - trustDomain: example.org
    bundleEndpointURL: https://example.org/
    bundleEndpointProfile: {type: https_web}
    refresh: {min: 1m}
`, check: func(t *testing.T, cfg *Config) {
			assert.Equal(t, Refresh{Min: time.Minute}, cfg.Endpoints[0].Refresh)
		}},
		{name: "refresh max only and empty refresh", yaml: `
federation:
  - trustDomain: a
    bundleEndpointURL: https://a/
    bundleEndpointProfile: {type: https_web}
    refresh: {max: 2h}
  - trustDomain: b
    bundleEndpointURL: https://b/
    bundleEndpointProfile: {type: https_web}
    refresh: {}
`, check: func(t *testing.T, cfg *Config) {
			assert.Equal(t, Refresh{Max: 2 * time.Hour}, cfg.Endpoints[0].Refresh)
			assert.Equal(t, Refresh{}, cfg.Endpoints[1].Refresh)
		}},
		{name: "refresh min equals max", yaml: `
federation:
  - trustDomain: a
    bundleEndpointURL: https://a/
    bundleEndpointProfile: {type: https_web}
    refresh: {min: 5m, max: 300s}
`, check: func(t *testing.T, cfg *Config) {
			assert.Equal(t, Refresh{Min: 5 * time.Minute, Max: 5 * time.Minute}, cfg.Endpoints[0].Refresh)
		}},
		{name: "not self-serving without x509 authorities", yaml: `
federation:
  - trustDomain: prod.example.org
    bundleEndpointURL: https://example.org/prod
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://example.org/bundle-server
    trustDomainBundle: '` + jwtOnly + `'
`, check: func(t *testing.T, cfg *Config) {
			require.Len(t, cfg.Endpoints, 1)
			assert.Empty(t, cfg.Endpoints[0].BootstrapBundle.X509Authorities())
		}},
		{name: "https_web without x509 authorities", yaml: `
federation:
  - trustDomain: prod.example.org
    bundleEndpointURL: https://example.org/prod
    bundleEndpointProfile: {type: https_web}
    trustDomainBundle: '` + jwtOnly + `'
`, check: func(t *testing.T, cfg *Config) {
			require.Len(t, cfg.Endpoints, 1)
			assert.Equal(t, ProfileHTTPSWeb, cfg.Endpoints[0].Profile)
			assert.Len(t, cfg.Endpoints[0].BootstrapBundle.JWTAuthorities(), 1)
		}},
		{name: "bundle warnings", yaml: `
federation:
  - trustDomain: example.org
    bundleEndpointURL: https://example.org/
    bundleEndpointProfile: {type: https_web}
    trustDomainBundle: '` + withIgnoredKey(t, caDoc) + `'
  - trustDomain: b
    bundleEndpointURL: https://b/
    bundleEndpointProfile: {type: https_web}
    trustDomainBundleFile: b.json
`, readFile: files(map[string]string{"b.json": withIgnoredKey(t, bundleJSON(t, testca.New(t, "b").Bundle()))}),
			check: func(t *testing.T, cfg *Config) {
				require.Len(t, cfg.Warnings, 2)
				assert.True(t, strings.HasPrefix(cfg.Warnings[0], "federation[0] (example.org): trustDomainBundle: keys[1]: "), cfg.Warnings[0])
				assert.True(t, strings.HasPrefix(cfg.Warnings[1], `federation[1] (b): trustDomainBundleFile "b.json": keys[1]: `), cfg.Warnings[1])
				assert.Len(t, cfg.Endpoints[0].BootstrapBundle.X509Authorities(), 1)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tt.yaml), tt.readFile)
			require.NoError(t, err)
			require.NotNil(t, cfg)
			if tt.check == nil {
				assert.Empty(t, cfg.Endpoints)
				assert.Empty(t, cfg.Warnings)
				return
			}
			tt.check(t, cfg)
		})
	}
}

func TestParseConfigRefuses(t *testing.T) {
	caDoc := bundleJSON(t, testca.New(t, "example.org").Bundle())
	jwtOnly := jwtOnlyBundle(t, "example.org")
	readFile := files(map[string]string{"ok.json": caDoc, "bad.json": `{"keys": 1}`})

	// item builds one federation item, overriding or adding the lines given.
	const item = `federation:
  - trustDomain: example.org
    bundleEndpointURL: https://example.org/
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://example.org/s
`
	tests := []struct {
		name, yaml, wantErr string
	}{
		// File and document structure.
		{"syntax error", "federation: [\n",
			"federation: yaml: line 1: did not find expected node content"},
		{"tab indentation", "federation:\n\t- trustDomain: a\n",
			"federation: yaml: line 2: found character that cannot start any token"},
		{"two documents", "federation: []\n---\nfederation: []\n",
			"federation: line 2: a second YAML document starts here; the file must hold exactly one"},
		{"top level list", "- trustDomain: a\n",
			"federation: line 1: the top level must be a mapping, got a list"},
		{"top level scalar", "federation\n",
			`federation: line 1: the top level must be a mapping, got !!str "federation"`},
		{"unknown top level key", "federation: []\nbundles: []\n",
			`federation: line 2: unknown key "bundles" in the top level (known: federation)`},
		{"duplicate top level key", "federation: []\nfederation: []\n",
			`federation: line 2: duplicate key "federation" in the top level (first at line 1)`},
		{"federation is a mapping", "federation:\n  trustDomain: a\n",
			"federation: line 2: federation must be a list, got a mapping"},
		{"federation is a scalar", "federation: a|https://a\n",
			`federation: line 1: federation must be a list, got !!str "a|https://a"`},
		{"item is a scalar", "federation:\n  - a|https://a\n",
			`federation: line 2: federation[0] must be a mapping, got !!str "a|https://a"`},

		// Keys.
		{"unknown item key with case slip", item + "  - trustdomain: b\n",
			`federation: line 7: unknown key "trustdomain" in federation[1] (did you mean "trustDomain"?) (known: trustDomain, bundleEndpointURL, bundleEndpointProfile, trustDomainBundle, trustDomainBundleFile, refresh)`},
		{"spire-controller-manager className", item + "    className: spire\n",
			`federation: line 7: unknown key "className" in federation[0] (known: trustDomain, bundleEndpointURL, bundleEndpointProfile, trustDomainBundle, trustDomainBundleFile, refresh)`},
		{"unknown profile key", item + "      endpointSpiffeId: spiffe://example.org/s\n",
			`federation: line 7: unknown key "endpointSpiffeId" in federation[0].bundleEndpointProfile (did you mean "endpointSPIFFEID"?) (known: type, endpointSPIFFEID)`},
		{"unknown refresh key", item + "    refresh: {min: 1s, maximum: 2s}\n",
			`federation: line 7: unknown key "maximum" in federation[0].refresh (known: min, max)`},
		{"duplicate item key", item + "    trustDomain: other.org\n",
			`federation: line 7: duplicate key "trustDomain" in federation[0] (first at line 2)`},
		{"duplicate profile key", item + "      type: https_web\n",
			`federation: line 7: duplicate key "type" in federation[0].bundleEndpointProfile (first at line 5)`},
		{"non-string key", item + "    [a]: b\n",
			`federation: line 7: federation[0]: keys must be strings, got a list`},
		{"alias value", "federation:\n  - &item\n    trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n  - *item\n",
			"federation: line 6: federation[1]: YAML aliases are not supported"},
		{"alias scalar", "federation:\n  - trustDomain: &td a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n  - trustDomain: *td\n",
			"federation: line 5: federation[1].trustDomain: YAML aliases are not supported"},
		{"merge key", "federation:\n  - <<: {trustDomain: a}\n",
			"federation: line 2: federation[0]: merge keys (<<) are not supported"},

		// Required keys and value kinds.
		{"missing trustDomain", "federation:\n  - bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 2: federation[0]: missing required key "trustDomain"`},
		{"missing bundleEndpointURL", "federation:\n  - trustDomain: a\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 2: federation[0]: missing required key "bundleEndpointURL"`},
		{"missing bundleEndpointProfile", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n",
			`federation: line 2: federation[0]: missing required key "bundleEndpointProfile"`},
		{"missing profile type", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {}\n",
			`federation: line 4: federation[0].bundleEndpointProfile: missing required key "type"`},
		{"trustDomain is a list", "federation:\n  - trustDomain: [a]\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
			"federation: line 2: federation[0].trustDomain must be a string, got a list"},
		{"trustDomain is null", "federation:\n  - trustDomain:\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
			"federation: line 2: federation[0].trustDomain has no value"},
		{"trustDomain is a number", "federation:\n  - trustDomain: 1e3\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 2: federation[0].trustDomain must be a string, got !!float "1e3"; quote it if it is meant as one`},
		{"bundleEndpointURL is a mapping", "federation:\n  - trustDomain: a\n    bundleEndpointURL: {url: https://a/}\n    bundleEndpointProfile: {type: https_web}\n",
			"federation: line 3: federation[0].bundleEndpointURL must be a string, got a mapping"},
		{"profile is a string", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: https_web\n",
			`federation: line 4: federation[0].bundleEndpointProfile must be a mapping, got !!str "https_web"`},
		{"profile type is a bool", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: true}\n",
			`federation: line 4: federation[0].bundleEndpointProfile.type must be a string, got !!bool "true"; quote it if it is meant as one`},
		{"refresh is a list", item + "    refresh: [1s, 2s]\n",
			"federation: line 7: federation[0].refresh must be a mapping, got a list"},

		// Shared rules, same as the string form.
		{"uppercase trust domain", "federation:\n  - trustDomain: Example.org\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 2: federation[0]: trustDomain "Example.org": trust domain characters are limited to lowercase letters, numbers, dots, dashes, and underscores`},
		{"trust domain as spiffe uri", "federation:\n  - trustDomain: spiffe://example.org\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 2: federation[0]: trustDomain "spiffe://example.org": must be a bare trust-domain name such as example.org, without scheme, port or path`},
		{"quoted whitespace in trust domain", "federation:\n  - trustDomain: ' a'\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 2: federation[0]: trustDomain " a": trust domain characters are limited to lowercase letters, numbers, dots, dashes, and underscores`},
		{"duplicate trust domain", item + "  - trustDomain: example.org\n    bundleEndpointURL: https://b/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 7: federation[1] (example.org): trust domain "example.org" is already configured by federation[0] (line 2)`},
		{"http url", "federation:\n  - trustDomain: a\n    bundleEndpointURL: http://a/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 3: federation[0] (a): bundleEndpointURL "http://a/": scheme must be https`},
		{"refresh below a second", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n    refresh: {min: 1ns}\n",
			`federation: line 5: federation[0] (a): refresh min 1ns is outside 1s to 720h0m0s`},
		{"refresh above 30 days", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n    refresh: {max: 2000000h}\n",
			`federation: line 5: federation[0] (a): refresh max 2000000h0m0s is outside 1s to 720h0m0s`},
		{"url with userinfo", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://u@a/\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 3: federation[0] (a): bundleEndpointURL "https://REDACTED@a/": must not contain userinfo`},
		{"url with bare fragment", "federation:\n  - trustDomain: a\n    bundleEndpointURL: 'https://a/#'\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 3: federation[0] (a): bundleEndpointURL "https://a/#": must not contain a fragment`},
		{"url with bar", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/?x=1|2\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 3: federation[0] (a): bundleEndpointURL "https://a/?x=1|2": contains '|', which a URL cannot hold unencoded`},
		{"url with empty port", "federation:\n  - trustDomain: a\n    bundleEndpointURL: 'https://a:/'\n    bundleEndpointProfile: {type: https_web}\n",
			`federation: line 3: federation[0] (a): bundleEndpointURL "https://a:/": port is empty`},
		{"unknown profile type", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https-web}\n",
			`federation: line 4: federation[0] (a): bundleEndpointProfile.type "https-web" is not one of https_web, https_spiffe`},
		{"https_spiffe without endpointSPIFFEID", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile:\n      type: https_spiffe\n",
			`federation: line 5: federation[0] (a): bundleEndpointProfile: type https_spiffe requires endpointSPIFFEID`},
		{"https_web with endpointSPIFFEID", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile:\n      type: https_web\n      endpointSPIFFEID: spiffe://a/s\n",
			`federation: line 6: federation[0] (a): bundleEndpointProfile: endpointSPIFFEID is only allowed with type https_spiffe`},
		{"root endpointSPIFFEID", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_spiffe, endpointSPIFFEID: 'spiffe://a'}\n",
			`federation: line 4: federation[0] (a): bundleEndpointProfile.endpointSPIFFEID "spiffe://a": has no path: an X509-SVID never carries a trust domain's root ID, so no endpoint server could match it`},
		{"invalid endpointSPIFFEID", "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_spiffe, endpointSPIFFEID: a/s}\n",
			`federation: line 4: federation[0] (a): bundleEndpointProfile.endpointSPIFFEID "a/s": scheme is missing or invalid`},

		// Bootstrap bundle.
		{"both bundle keys", item + "    trustDomainBundleFile: ok.json\n    trustDomainBundle: '" + caDoc + "'\n",
			"federation: line 8: federation[0] (example.org): trustDomainBundle and trustDomainBundleFile are mutually exclusive"},
		{"both bundle keys other order", item + "    trustDomainBundle: '" + caDoc + "'\n    trustDomainBundleFile: ok.json\n",
			"federation: line 8: federation[0] (example.org): trustDomainBundle and trustDomainBundleFile are mutually exclusive"},
		{"empty inline bundle", item + "    trustDomainBundle: ''\n",
			"federation: line 7: federation[0] (example.org): trustDomainBundle is empty"},
		{"empty bundle file name", item + "    trustDomainBundleFile: ''\n",
			"federation: line 7: federation[0] (example.org): trustDomainBundleFile is empty"},
		{"missing bundle file", item + "    trustDomainBundleFile: nope.json\n",
			`federation: line 7: federation[0] (example.org): trustDomainBundleFile "nope.json": open nope.json: file does not exist`},
		{"bad bundle file", item + "    trustDomainBundleFile: bad.json\n",
			`federation: line 7: federation[0] (example.org): trustDomainBundleFile "bad.json": "keys" must be an array, got a number`},
		{"bad inline bundle", item + "    trustDomainBundle: '{\"keys\": 1}'\n",
			`federation: line 7: federation[0] (example.org): trustDomainBundle: "keys" must be an array, got a number`},
		{"self-serving bundle without x509 authorities", item + "    trustDomainBundle: '" + jwtOnly + "'\n",
			"federation: line 7: federation[0] (example.org): trustDomainBundle: bootstrap bundle has no X.509 authorities, so it could never authenticate the first fetch from self-serving endpoint spiffe://example.org/s"},

		// Refresh.
		{"refresh zero", item + "    refresh: {min: 0s}\n",
			`federation: line 7: federation[0] (example.org): refresh.min "0s" must be positive`},
		{"refresh negative", item + "    refresh: {max: -1m}\n",
			`federation: line 7: federation[0] (example.org): refresh.max "-1m" must be positive`},
		{"refresh not a duration", item + "    refresh: {max: 1 hour}\n",
			`federation: line 7: federation[0] (example.org): refresh.max: time: unknown unit " hour" in duration "1 hour"`},
		{"refresh number", item + "    refresh: {max: 30}\n",
			`federation: line 7: federation[0].refresh.max must be a string, got !!int "30"; quote it if it is meant as one`},
		{"refresh min above max", item + "    refresh:\n      min: 1h\n      max: 1m\n",
			"federation: line 8: federation[0] (example.org): refresh min 1h0m0s is greater than max 1m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tt.yaml), readFile)
			require.EqualError(t, err, tt.wantErr)
			assert.Nil(t, cfg)
		})
	}
}

func TestParseConfigWithoutReadFile(t *testing.T) {
	const doc = `federation:
  - trustDomain: a
    bundleEndpointURL: https://a/
    bundleEndpointProfile: {type: https_web}
    trustDomainBundleFile: a.json
`
	cfg, err := ParseConfig([]byte(doc), nil)
	require.EqualError(t, err, "federation: line 5: federation[0] (a): trustDomainBundleFile not supported here")
	assert.Nil(t, cfg)
}

func TestParseConfigReadFileError(t *testing.T) {
	errBoom := errors.New("boom")
	const doc = `federation:
  - trustDomain: a
    bundleEndpointURL: https://a/
    bundleEndpointProfile: {type: https_web}
    trustDomainBundleFile: a.json
`
	_, err := ParseConfig([]byte(doc), func(string) ([]byte, error) { return nil, errBoom })
	assert.ErrorIs(t, err, errBoom)
}

// The YAML form and the string form must accept the same endpoints: what
// one accepts, the other can express.
func TestParseConfigAgreesWithParseEndpoints(t *testing.T) {
	const doc = `federation:
  - trustDomain: a
    bundleEndpointURL: HTTPS://a:8443/x%2Fy?q
    bundleEndpointProfile: {type: https_web}
  - trustDomain: b
    bundleEndpointURL: https://[::1]/
    bundleEndpointProfile: {type: https_spiffe, endpointSPIFFEID: spiffe://a/s}
`
	cfg, err := ParseConfig([]byte(doc), nil)
	require.NoError(t, err)
	eps, err := ParseEndpoints(FormatEndpoints(cfg.Endpoints))
	require.NoError(t, err)
	assert.Equal(t, cfg.Endpoints, eps)
}

func TestParseConfigCapsBootstrapFileSize(t *testing.T) {
	cfg := "federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n    trustDomainBundleFile: big.json\n"
	huge := func(string) ([]byte, error) { return make([]byte, bundledoc.DefaultMaxSize+1), nil }
	_, err := ParseConfig([]byte(cfg), huge)
	assert.ErrorContains(t, err, `trustDomainBundleFile "big.json": larger than 1048576 bytes`)
}
