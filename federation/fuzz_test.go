package federation

import (
	"io/fs"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// checkInvariants checks what every accepted endpoint must satisfy,
// independently of the validation code it is testing.
func checkInvariants(t *testing.T, eps []Endpoint) {
	t.Helper()
	seen := make(map[spiffeid.TrustDomain]bool)
	for i, ep := range eps {
		require.False(t, ep.TrustDomain.IsZero(), "endpoint %d: zero trust domain", i)
		require.False(t, seen[ep.TrustDomain], "endpoint %d: duplicate trust domain %q", i, ep.TrustDomain)
		seen[ep.TrustDomain] = true

		u := ep.URL
		require.NotNil(t, u, "endpoint %d: nil URL", i)
		assert.Equal(t, "https", u.Scheme, "endpoint %d: scheme", i)
		assert.Empty(t, u.Opaque, "endpoint %d: opaque", i)
		assert.NotEmpty(t, u.Hostname(), "endpoint %d: host", i)
		assert.Nil(t, u.User, "endpoint %d: userinfo", i)
		assert.Empty(t, u.Fragment, "endpoint %d: fragment", i)
		assert.Empty(t, u.RawFragment, "endpoint %d: fragment", i)
		assert.NotContains(t, u.String(), "#", "endpoint %d: fragment", i)

		switch ep.Profile {
		case ProfileHTTPSWeb:
			assert.True(t, ep.EndpointSPIFFEID.IsZero(), "endpoint %d: https_web with endpoint SPIFFE ID", i)
		case ProfileHTTPSSPIFFE:
			assert.False(t, ep.EndpointSPIFFEID.IsZero(), "endpoint %d: https_spiffe without endpoint SPIFFE ID", i)
			assert.NotEmpty(t, ep.EndpointSPIFFEID.Path(), "endpoint %d: root endpoint SPIFFE ID", i)
		default:
			t.Fatalf("endpoint %d: profile %q", i, ep.Profile)
		}

		if b := ep.BootstrapBundle; b != nil {
			assert.Equal(t, ep.TrustDomain, b.TrustDomain(), "endpoint %d: bootstrap bundle trust domain", i)
		}
		assert.GreaterOrEqual(t, ep.Refresh.Min, time.Duration(0), "endpoint %d: refresh min", i)
		assert.GreaterOrEqual(t, ep.Refresh.Max, time.Duration(0), "endpoint %d: refresh max", i)
		if ep.Refresh.Min > 0 && ep.Refresh.Max > 0 {
			assert.LessOrEqual(t, ep.Refresh.Min, ep.Refresh.Max, "endpoint %d: refresh", i)
		}
	}
}

// checkStringRoundTrip checks that eps survive FormatEndpoints and
// ParseEndpoints, apart from what the string form cannot carry.
func checkStringRoundTrip(t *testing.T, eps []Endpoint) {
	t.Helper()
	want := make([]Endpoint, 0, len(eps))
	for _, ep := range eps {
		want = append(want, Endpoint{TrustDomain: ep.TrustDomain, URL: ep.URL, Profile: ep.Profile, EndpointSPIFFEID: ep.EndpointSPIFFEID})
	}
	s := FormatEndpoints(eps)
	got, err := ParseEndpoints(s)
	require.NoError(t, err, "reparsing %q", s)
	if len(want) == 0 {
		assert.Empty(t, got)
		return
	}
	assert.Equal(t, want, got, "reparsing %q", s)
}

func FuzzParseEndpoints(f *testing.F) {
	for _, s := range []string{
		"",
		" \n ",
		"foo|https://url/for/foo||bar|https://url/for/bar",
		"foo.com|https://foo.com:8443/b?x=1|spiffe://foo.com/spire/server",
		"prod.example.com|https://example.com/prod|spiffe://example.com/s",
		"\n  foo|HTTPS://foo/ ||\n bar|https://[::1]:443/x%2Fy|spiffe://bar/s\n",
		"foo|https://foo||",
		"a|https://a||||b|https://b",
		"a|https://a|||b|https://b",
		"foo",
		"foo|https://foo|spiffe://foo/s|x",
		"|https://foo",
		"foo|",
		"foo|https://foo|",
		"Foo|https://foo",
		"foo:443|https://foo",
		"spiffe://foo|https://foo",
		"foo |https://foo",
		"foo|https://a||foo|https://b",
		"bar|ftp://x",
		"bar|https://u@bar/",
		"bar|https://bar/#",
		"bar|https:///x",
		"bar|https:bar",
		"bar|https://bar:99999/",
		"bar|https://bar:/",
		"bar|https://bar/a b",
		"bar|https://bar/|spiffe://bar",
		"bar|https://bar/|spiffe://bar/",
		"bar|https://[fe80::1%25en0]/",
		"bar|https://bar/|spiffe://bar/s|bar.json",
		"bar|https://bar/|spiffe://bar/s|bar.json||foo|https://foo/",
		"bar|https://bar/|spiffe://bar/s|other.json",
		"bar|https://bar/|spiffe://bar/s|",
		"bar|https://bar/|spiffe://bar/s|a b",
		"bar|https://bar/|spiffe://bar/s|missing.json",
		"bar|https://bar/|spiffe://bar/s|bar.json|x",
	} {
		f.Add(s)
	}
	// The fourth field's files: the fuzzer reaches them by name.
	bar := testca.New(f, "bar")
	read := func(p string) ([]byte, error) {
		switch p {
		case "bar.json":
			return bundledoc.Marshal(bar.Bundle())
		case "other.json":
			return []byte(`{"keys":[{"kty":"EC"}]}`), nil
		}
		return nil, fs.ErrNotExist
	}
	f.Fuzz(func(t *testing.T, s string) {
		eps, err := ParseEndpoints(s)
		if err != nil {
			require.Nil(t, eps, "partial configuration returned with error %v", err)
		} else {
			checkInvariants(t, eps)
			checkStringRoundTrip(t, eps)
		}

		// With files: whatever ParseEndpoints accepts parses the same,
		// and a fourth field always brings a checked bootstrap bundle.
		cfg, ferr := ParseEndpointsConfig(s, read)
		if err == nil {
			require.NoError(t, ferr, "a file reader must not refuse what parses without one")
			assert.Equal(t, eps, cfg.Endpoints)
		}
		if ferr != nil {
			require.Nil(t, cfg, "partial configuration returned with error %v", ferr)
			return
		}
		checkInvariants(t, cfg.Endpoints)
		for i, ep := range cfg.Endpoints {
			if ep.BootstrapBundleFile == "" {
				assert.Nil(t, ep.BootstrapBundle, "endpoint %d", i)
				continue
			}
			assert.Equal(t, ProfileHTTPSSPIFFE, ep.Profile, "endpoint %d: only https_spiffe tuples carry a file", i)
			require.NotNil(t, ep.BootstrapBundle, "endpoint %d", i)
			if ep.EndpointSPIFFEID.MemberOf(ep.TrustDomain) {
				assert.NoError(t, CheckFirstFetch(ep, nil), "endpoint %d", i)
			} else {
				// A hub's server is authenticated with its own trust
				// domain's roots, which this endpoint's bundle is not.
				assert.ErrorIs(t, CheckFirstFetch(ep, nil), ErrNoServerBundle, "endpoint %d", i)
			}
		}
		checkStringRoundTrip(t, cfg.Endpoints)
	})
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"",
		"federation: []\n",
		"federation:\n",
		"---\n",
		"federation: []\n---\n",
		`federation:
  - trustDomain: example.org
    bundleEndpointURL: https://example.org:8443/
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://example.org/spire/server
    refresh: {min: 30s, max: 1h}
  - trustDomain: bar
    bundleEndpointURL: HTTPS://bar/?q=1
    bundleEndpointProfile: {type: https_web}
`,
		"federation:\n  - trustdomain: a\n",
		"federation:\n  - trustDomain: a\n    trustDomain: b\n",
		"federation:\n  - trustDomain: [a]\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n",
		"federation:\n  - trustDomain: &x a\n    bundleEndpointURL: *x\n",
		"federation:\n  - <<: {trustDomain: a}\n",
		"federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n    trustDomainBundle: '{\"keys\":[]}'\n",
		"federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_spiffe, endpointSPIFFEID: spiffe://a/s}\n    trustDomainBundle: '{\"keys\":[]}'\n",
		"federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n    trustDomainBundleFile: a.json\n",
		"federation:\n  - trustDomain: a\n    bundleEndpointURL: https://a/\n    bundleEndpointProfile: {type: https_web}\n    refresh: {min: 1h, max: 1m}\n",
		"federation: [{trustDomain: a, bundleEndpointURL: 'https://a/#', bundleEndpointProfile: {type: https_web}}]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data, nil)
		if err != nil {
			require.Nil(t, cfg, "config returned with error %v", err)
			return
		}
		require.NotNil(t, cfg)
		checkInvariants(t, cfg.Endpoints)
		for i, ep := range cfg.Endpoints {
			assert.Empty(t, ep.BootstrapBundleFile, "endpoint %d: bundle file without readFile", i)
		}
		checkStringRoundTrip(t, cfg.Endpoints)
	})
}
