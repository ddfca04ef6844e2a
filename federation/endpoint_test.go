package federation

import (
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func td(s string) spiffeid.TrustDomain { return spiffeid.RequireTrustDomainFromString(s) }
func id(s string) spiffeid.ID          { return spiffeid.RequireFromString(s) }

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

func web(t testing.TB, trustDomain, u string) Endpoint {
	return Endpoint{TrustDomain: td(trustDomain), URL: mustURL(t, u), Profile: ProfileHTTPSWeb}
}

func spiffe(t testing.TB, trustDomain, u, endpointID string) Endpoint {
	return Endpoint{TrustDomain: td(trustDomain), URL: mustURL(t, u), Profile: ProfileHTTPSSPIFFE, EndpointSPIFFEID: id(endpointID)}
}

func TestParseEndpointsAccepts(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Endpoint
	}{
		{name: "empty", in: ""},
		{name: "all whitespace", in: " \n\t "},
		{name: "istio two fields is https_web", in: "foo.com|https://foo.com/bundle",
			want: []Endpoint{web(t, "foo.com", "https://foo.com/bundle")}},
		{name: "istio two tuples", in: "foo|https://url/for/foo||bar|https://url/for/bar",
			want: []Endpoint{web(t, "foo", "https://url/for/foo"), web(t, "bar", "https://url/for/bar")}},
		{name: "third field is https_spiffe", in: "foo.com|https://foo.com:8443/|spiffe://foo.com/spire/server",
			want: []Endpoint{spiffe(t, "foo.com", "https://foo.com:8443/", "spiffe://foo.com/spire/server")}},
		{name: "endpoint id in another trust domain", in: "prod.example.com|https://example.com/prod|spiffe://example.com/bundle-server",
			want: []Endpoint{spiffe(t, "prod.example.com", "https://example.com/prod", "spiffe://example.com/bundle-server")}},
		{name: "mixed profiles", in: "a|https://a/||b|https://b/|spiffe://b/s",
			want: []Endpoint{web(t, "a", "https://a/"), spiffe(t, "b", "https://b/", "spiffe://b/s")}},
		{name: "whitespace at tuple edges", in: "\n  foo|https://foo/ ||\n\tbar|https://bar/|spiffe://bar/s\n",
			want: []Endpoint{web(t, "foo", "https://foo/"), spiffe(t, "bar", "https://bar/", "spiffe://bar/s")}},
		{name: "uppercase scheme", in: "foo|HTTPS://foo/b",
			want: []Endpoint{web(t, "foo", "https://foo/b")}},
		{name: "query string", in: "foo|https://foo/b?td=foo&x=%7C",
			want: []Endpoint{web(t, "foo", "https://foo/b?td=foo&x=%7C")}},
		{name: "port and ipv6", in: "foo|https://[2001:db8::1]:65535/b",
			want: []Endpoint{web(t, "foo", "https://[2001:db8::1]:65535/b")}},
		{name: "percent-encoded path", in: "foo|https://foo/a%20b%2Fc",
			want: []Endpoint{web(t, "foo", "https://foo/a%20b%2Fc")}},
		{name: "trust domain charset", in: "a-b_c.0|https://x",
			want: []Endpoint{web(t, "a-b_c.0", "https://x")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEndpoints(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseEndpointsRefuses(t *testing.T) {
	const rootIDErr = "has no path: an X509-SVID never carries a trust domain's root ID, so no endpoint server could match it"
	tests := []struct {
		name, in, wantErr string
	}{
		// Tuple and field shape.
		{"trailing separator", "foo|https://foo/||",
			`federation: endpoint 1 (""): empty tuple (stray "||"?)`},
		{"trailing separator and newline", "foo|https://foo/||\n",
			`federation: endpoint 1 (""): empty tuple (stray "||"?)`},
		{"leading separator", "||foo|https://foo/",
			`federation: endpoint 0 (""): empty tuple (stray "||"?)`},
		{"double separator", "a|https://a||||b|https://b",
			`federation: endpoint 1 (""): empty tuple (stray "||"?)`},
		{"whitespace tuple", "a|https://a|| \t ||b|https://b",
			`federation: endpoint 1 (""): empty tuple (stray "||"?)`},
		{"one field", "foo.com",
			`federation: endpoint 0 ("foo.com"): has 1 field(s), want trust-domain|url or trust-domain|url|endpoint-spiffe-id`},
		{"four fields", "foo|https://foo|spiffe://foo/s|x",
			`federation: endpoint 0 ("foo|https://foo|spiffe://foo/s|x"): has 4 field(s), want trust-domain|url or trust-domain|url|endpoint-spiffe-id`},
		{"triple bar", "a|https://a|||b|https://b",
			`federation: endpoint 1 ("|b|https://b"): trust domain "": is empty`},
		{"empty trust domain", "|https://foo",
			`federation: endpoint 0 ("|https://foo"): trust domain "": is empty`},
		{"empty url", "foo|",
			`federation: endpoint 0 ("foo|"): URL "": is empty`},
		{"empty spiffe id", "foo|https://foo|",
			`federation: endpoint 0 ("foo|https://foo|"): endpoint SPIFFE ID "": is empty`},

		// Trust domain.
		{"uppercase trust domain", "Foo.com|https://foo",
			`federation: endpoint 0 ("Foo.com|https://foo"): trust domain "Foo.com": trust domain characters are limited to lowercase letters, numbers, dots, dashes, and underscores`},
		{"trust domain with port", "foo.com:443|https://foo",
			`federation: endpoint 0 ("foo.com:443|https://foo"): trust domain "foo.com:443": must be a bare trust-domain name such as example.org, without scheme, port or path`},
		{"trust domain as spiffe uri", "spiffe://foo.com|https://foo",
			`federation: endpoint 0 ("spiffe://foo.com|https://foo"): trust domain "spiffe://foo.com": must be a bare trust-domain name such as example.org, without scheme, port or path`},
		{"trust domain with path", "foo.com/x|https://foo",
			`federation: endpoint 0 ("foo.com/x|https://foo"): trust domain "foo.com/x": must be a bare trust-domain name such as example.org, without scheme, port or path`},
		{"trust domain bad char", "foo$|https://foo",
			`federation: endpoint 0 ("foo$|https://foo"): trust domain "foo$": trust domain characters are limited to lowercase letters, numbers, dots, dashes, and underscores`},
		{"whitespace in trust domain", "foo |https://foo",
			`federation: endpoint 0 ("foo |https://foo"): trust domain "foo ": trust domain characters are limited to lowercase letters, numbers, dots, dashes, and underscores`},
		{"duplicate trust domain", "foo|https://a||bar|https://b||foo|https://c",
			`federation: endpoint 2 ("foo|https://c"): trust domain "foo" is already configured by endpoint 0 ("foo|https://a")`},

		// URL.
		{"http", "bar|http://x",
			`federation: endpoint 0 ("bar|http://x"): URL "http://x": scheme must be https`},
		{"ftp", "foo|https://foo||bar|ftp://x",
			`federation: endpoint 1 ("bar|ftp://x"): URL "ftp://x": scheme must be https`},
		{"no scheme", "bar|bar.com/bundle",
			`federation: endpoint 0 ("bar|bar.com/bundle"): URL "bar.com/bundle": has no scheme; write it as https://bar.com/bundle`},
		{"userinfo", "bar|https://user:pw@bar/",
			`federation: endpoint 0 ("bar|https://REDACTED@bar/"): URL "https://REDACTED@bar/": must not contain userinfo`},
		{"empty userinfo", "bar|https://@bar/",
			`federation: endpoint 0 ("bar|https://REDACTED@bar/"): URL "https://REDACTED@bar/": must not contain userinfo`},
		{"host and port without scheme", "bar|localhost:8443",
			`federation: endpoint 0 ("bar|localhost:8443"): URL "localhost:8443": has no scheme; write it as https://localhost:8443`},
		{"unicode space at tuple edge", "bar|https://bar/\u00a0",
			`federation: endpoint 0 ("bar|https://bar/\u00a0"): URL "https://bar/\u00a0": contains '\u00a0', which a URL cannot hold unencoded`},
		{"trailing dot trust domain", "bar.|https://bar/",
			`federation: endpoint 0 ("bar.|https://bar/"): trust domain "bar.": has an empty label (leading, trailing or doubled dot)`},
		{"fragment", "bar|https://bar/#x",
			`federation: endpoint 0 ("bar|https://bar/#x"): URL "https://bar/#x": must not contain a fragment`},
		{"bare fragment", "bar|https://bar/#",
			`federation: endpoint 0 ("bar|https://bar/#"): URL "https://bar/#": must not contain a fragment`},
		{"missing host", "bar|https:///bundle",
			`federation: endpoint 0 ("bar|https:///bundle"): URL "https:///bundle": host is missing`},
		{"port without host", "bar|https://:443/",
			`federation: endpoint 0 ("bar|https://:443/"): URL "https://:443/": host is missing`},
		{"opaque", "bar|https:bar.com",
			`federation: endpoint 0 ("bar|https:bar.com"): URL "https:bar.com": must be an absolute URL with a host ("https://host/path"), not an opaque URL`},
		{"port too large", "bar|https://bar:65536/",
			`federation: endpoint 0 ("bar|https://bar:65536/"): URL "https://bar:65536/": port "65536" is not a number from 1 to 65535`},
		{"port zero", "bar|https://bar:0/",
			`federation: endpoint 0 ("bar|https://bar:0/"): URL "https://bar:0/": port "0" is not a number from 1 to 65535`},
		{"empty port", "bar|https://bar:/",
			`federation: endpoint 0 ("bar|https://bar:/"): URL "https://bar:/": port is empty`},
		{"non-numeric port", "bar|https://bar:x/",
			`federation: endpoint 0 ("bar|https://bar:x/"): URL "https://bar:x/": invalid port ":x" after host`},
		{"bad escape", "bar|https://bar/%zz",
			`federation: endpoint 0 ("bar|https://bar/%zz"): URL "https://bar/%zz": invalid URL escape "%zz"`},
		{"leading whitespace in url", "bar| https://bar/",
			`federation: endpoint 0 ("bar| https://bar/"): URL " https://bar/": contains ' ', which a URL cannot hold unencoded`},
		{"trailing whitespace in url", "bar|https://bar/ |spiffe://bar/s",
			`federation: endpoint 0 ("bar|https://bar/ |spiffe://bar/s"): URL "https://bar/ ": contains ' ', which a URL cannot hold unencoded`},
		{"space in url path", "bar|https://bar/a b",
			`federation: endpoint 0 ("bar|https://bar/a b"): URL "https://bar/a b": contains ' ', which a URL cannot hold unencoded`},
		{"non-ascii url", "bar|https://bär/",
			`federation: endpoint 0 ("bar|https://bär/"): URL "https://bär/": contains 'ä', which a URL cannot hold unencoded`},

		// Endpoint SPIFFE ID.
		{"third field not a spiffe id", "bar|https://bar/|https://bar/",
			`federation: endpoint 0 ("bar|https://bar/|https://bar/"): endpoint SPIFFE ID "https://bar/": scheme is missing or invalid`},
		{"root spiffe id", "bar|https://bar/|spiffe://bar",
			`federation: endpoint 0 ("bar|https://bar/|spiffe://bar"): endpoint SPIFFE ID "spiffe://bar": ` + rootIDErr},
		{"root spiffe id with slash", "bar|https://bar/|spiffe://bar/",
			`federation: endpoint 0 ("bar|https://bar/|spiffe://bar/"): endpoint SPIFFE ID "spiffe://bar/": path cannot have a trailing slash`},
		{"bad spiffe id", "bar|https://bar/|spiffe://Bar/s",
			`federation: endpoint 0 ("bar|https://bar/|spiffe://Bar/s"): endpoint SPIFFE ID "spiffe://Bar/s": trust domain characters are limited to lowercase letters, numbers, dots, dashes, and underscores`},
		{"whitespace in spiffe id", "bar|https://bar/| spiffe://bar/s",
			`federation: endpoint 0 ("bar|https://bar/| spiffe://bar/s"): endpoint SPIFFE ID " spiffe://bar/s": scheme is missing or invalid`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEndpoints(tt.in)
			require.EqualError(t, err, tt.wantErr)
			// Never a partial configuration.
			assert.Nil(t, got)
		})
	}
}

func TestEndpointString(t *testing.T) {
	tests := []struct {
		name string
		ep   Endpoint
		want string
	}{
		{"https_web", web(t, "foo", "https://foo/b?x=1"), "foo|https://foo/b?x=1"},
		{"https_spiffe", spiffe(t, "foo", "HTTPS://foo:8443/", "spiffe://foo/s"), "foo|https://foo:8443/|spiffe://foo/s"},
		{"bundle and refresh are left out", func() Endpoint {
			e := web(t, "foo", "https://foo/")
			e.BootstrapBundle = spiffebundle.New(td("foo"))
			e.BootstrapBundleFile = "foo.json"
			e.Refresh = Refresh{Min: time.Second, Max: time.Hour}
			return e
		}(), "foo|https://foo/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.ep.String())
		})
	}
}

func TestFormatEndpointsRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		eps  []Endpoint
		want string
	}{
		{"none", nil, ""},
		{"one", []Endpoint{web(t, "foo", "https://foo/")}, "foo|https://foo/"},
		{"several", []Endpoint{
			web(t, "foo", "https://foo/b?q=%7C&r"),
			spiffe(t, "bar", "https://[::1]:8443/x%2Fy", "spiffe://bar/spire/server"),
			spiffe(t, "baz.example", "https://example.com", "spiffe://example.com/bundle-server"),
		}, "foo|https://foo/b?q=%7C&r||bar|https://[::1]:8443/x%2Fy|spiffe://bar/spire/server||baz.example|https://example.com|spiffe://example.com/bundle-server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := FormatEndpoints(tt.eps)
			assert.Equal(t, tt.want, s)
			got, err := ParseEndpoints(s)
			require.NoError(t, err)
			assert.Equal(t, tt.eps, got)
		})
	}
}

func TestMergeEndpoints(t *testing.T) {
	a, b, c := web(t, "a", "https://a/"), spiffe(t, "b", "https://b/", "spiffe://b/s"), web(t, "c", "https://c/")
	got, err := MergeEndpoints([]Endpoint{a, b}, nil, []Endpoint{c})
	require.NoError(t, err)
	assert.Equal(t, []Endpoint{a, b, c}, got)

	got, err = MergeEndpoints()
	require.NoError(t, err)
	assert.Empty(t, got)

	ca := testca.New(t, "b")
	withBundle := b
	withBundle.BootstrapBundle = ca.Bundle()
	withBundle.Refresh = Refresh{Min: time.Minute}
	got, err = MergeEndpoints([]Endpoint{withBundle})
	require.NoError(t, err)
	assert.Equal(t, []Endpoint{withBundle}, got)
}

func TestMergeEndpointsRefuses(t *testing.T) {
	a := web(t, "a", "https://a/")
	mod := func(e Endpoint, f func(*Endpoint)) Endpoint { f(&e); return e }
	selfServing := spiffe(t, "b", "https://b/", "spiffe://b/s")
	tests := []struct {
		name    string
		sets    [][]Endpoint
		wantErr string
	}{
		{"duplicate across sources", [][]Endpoint{{a}, {web(t, "b", "https://b/"), web(t, "a", "https://other/")}},
			`federation: source 1 endpoint 1 ("a|https://other/"): trust domain "a" is already configured by source 0 endpoint 0 ("a|https://a/")`},
		{"duplicate within a source", [][]Endpoint{{a, a}},
			`federation: source 0 endpoint 1 ("a|https://a/"): trust domain "a" is already configured by source 0 endpoint 0 ("a|https://a/")`},
		{"zero trust domain", [][]Endpoint{{mod(a, func(e *Endpoint) { e.TrustDomain = spiffeid.TrustDomain{} })}},
			`federation: source 0 endpoint 0 ("|https://a/"): trust domain is missing`},
		{"nil url", [][]Endpoint{{mod(a, func(e *Endpoint) { e.URL = nil })}},
			`federation: source 0 endpoint 0 ("a|"): URL is missing`},
		{"http url", [][]Endpoint{{mod(a, func(e *Endpoint) { e.URL = mustURL(t, "http://a/") })}},
			`federation: source 0 endpoint 0 ("a|http://a/"): URL "http://a/": scheme must be https`},
		{"url with fragment", [][]Endpoint{{mod(a, func(e *Endpoint) { e.URL = mustURL(t, "https://a/#f") })}},
			`federation: source 0 endpoint 0 ("a|https://a/#f"): URL "https://a/#f": must not contain a fragment`},
		{"unknown profile", [][]Endpoint{{mod(a, func(e *Endpoint) { e.Profile = "https" })}},
			`federation: source 0 endpoint 0 ("a|https://a/"): profile "https" is not one of https_web, https_spiffe`},
		{"https_web with id", [][]Endpoint{{mod(a, func(e *Endpoint) { e.EndpointSPIFFEID = id("spiffe://a/s") })}},
			`federation: source 0 endpoint 0 ("a|https://a/"): https_web takes no endpoint SPIFFE ID`},
		{"https_spiffe without id", [][]Endpoint{{mod(a, func(e *Endpoint) { e.Profile = ProfileHTTPSSPIFFE })}},
			`federation: source 0 endpoint 0 ("a|https://a/|"): endpoint SPIFFE ID is missing`},
		{"https_spiffe with root id", [][]Endpoint{{mod(selfServing, func(e *Endpoint) { e.EndpointSPIFFEID = id("spiffe://b") })}},
			`federation: source 0 endpoint 0 ("b|https://b/|spiffe://b"): endpoint SPIFFE ID has no path: an X509-SVID never carries a trust domain's root ID, so no endpoint server could match it`},
		{"negative refresh", [][]Endpoint{{mod(a, func(e *Endpoint) { e.Refresh.Max = -time.Second })}},
			`federation: source 0 endpoint 0 ("a|https://a/"): refresh max -1s is negative`},
		{"refresh min above max", [][]Endpoint{{mod(a, func(e *Endpoint) { e.Refresh = Refresh{Min: time.Hour, Max: time.Minute} })}},
			`federation: source 0 endpoint 0 ("a|https://a/"): refresh min 1h0m0s is greater than max 1m0s`},
		{"bootstrap bundle of another trust domain", [][]Endpoint{{mod(a, func(e *Endpoint) { e.BootstrapBundle = testca.New(t, "b").Bundle() })}},
			`federation: source 0 endpoint 0 ("a|https://a/"): bootstrap bundle is for trust domain "b", not "a"`},
		{"self-serving without x509 authorities", [][]Endpoint{{mod(selfServing, func(e *Endpoint) { e.BootstrapBundle = spiffebundle.New(td("b")) })}},
			`federation: source 0 endpoint 0 ("b|https://b/|spiffe://b/s"): bootstrap bundle has no X.509 authorities, so it could never authenticate the first fetch from self-serving endpoint spiffe://b/s`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MergeEndpoints(tt.sets...)
			require.EqualError(t, err, tt.wantErr)
			assert.Nil(t, got)
		})
	}
}

func TestMergeEndpointsAcceptsEmptyBundleWhenNotSelfServing(t *testing.T) {
	// The first fetch is authenticated with the endpoint's own trust
	// domain's bundle, so the bootstrap bundle only seeds the store.
	for _, ep := range []Endpoint{
		spiffe(t, "prod.example.com", "https://example.com/", "spiffe://example.com/s"),
		web(t, "prod.example.com", "https://example.com/"),
	} {
		ep.BootstrapBundle = spiffebundle.New(td("prod.example.com"))
		t.Run(string(ep.Profile), func(t *testing.T) {
			_, err := MergeEndpoints([]Endpoint{ep})
			assert.NoError(t, err)
		})
	}
}
