package workloaddns

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
)

var td = spiffeid.RequireTrustDomainFromString("example.org")

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, tmpl string
		td         string // default example.org
		want       string // Names for ns "prod", sa "web"; "" when Parse must fail
		wantErr    string
	}{
		{name: "osm", tmpl: "{sa}.{ns}.{td}", want: "web.prod.example.org"},
		{name: "kubernetes service", tmpl: "{sa}.{ns}.svc.cluster.local", want: "web.prod.svc.cluster.local"},
		{name: "namespace first", tmpl: "{ns}.{sa}.mesh", want: "prod.web.mesh"},
		{name: "placeholders last", tmpl: "mesh.{ns}.{sa}", wantErr: "must end in a fixed zone"},
		{name: "td in the middle", tmpl: "{sa}.{ns}.{td}.internal", want: "web.prod.example.org.internal"},
		{name: "two placeholders only", tmpl: "{sa}.{ns}", wantErr: "must end in a fixed zone"},
		{name: "namespace chooses the zone", tmpl: "{ns}.{sa}", wantErr: "must end in a fixed zone"},
		{name: "only a prefix is fixed", tmpl: "a.b.{sa}.{ns}", wantErr: "must end in a fixed zone"},
		{name: "trust domain as the zone", tmpl: "{sa}.{ns}.{td}", want: "web.prod.example.org"},
		{name: "empty", tmpl: "", wantErr: "empty"},
		{name: "no sa", tmpl: "{ns}.svc", wantErr: "{sa} is missing"},
		{name: "no ns", tmpl: "{sa}.svc", wantErr: "{ns} is missing"},
		{name: "sa twice", tmpl: "{sa}.{ns}.{sa}", wantErr: "{sa} appears 2 times"},
		{name: "td twice", tmpl: "{sa}.{ns}.{td}.{td}", wantErr: "{td} appears 2 times"},
		{name: "uppercase", tmpl: "{sa}.{ns}.SVC", wantErr: "column 11: 'S': write the template in lowercase"},
		{name: "uppercase placeholder", tmpl: "{SA}.{ns}", wantErr: "unknown placeholder \"{SA}\""},
		{name: "wildcard", tmpl: "*.{sa}.{ns}", wantErr: "column 1: '*': wildcards are never issued"},
		{name: "inner wildcard", tmpl: "{sa}.{ns}.*", wantErr: "wildcards"},
		{name: "unknown placeholder", tmpl: "{sa}.{ns}.{cluster}", wantErr: "column 11: unknown placeholder \"{cluster}\""},
		{name: "go template", tmpl: "{{.sa}}.{ns}", wantErr: "unknown placeholder"},
		{name: "unclosed", tmpl: "{sa}.{ns", wantErr: "column 6: '{' without '}'"},
		{name: "stray brace", tmpl: "{sa}.{ns}}", wantErr: "'}'"},
		{name: "underscore", tmpl: "{sa}.{ns}.my_zone", wantErr: "'_'"},
		{name: "space", tmpl: "{sa}.{ns} .svc", wantErr: "' '"},
		{name: "unicode", tmpl: "{sa}.{ns}.bücher", wantErr: `column 12: '\u00fc'`},
		{name: "ns glued to text", tmpl: "{sa}.{ns}x.svc", wantErr: "{ns} must end the name or be followed by a '.'"},
		{name: "ns glued to sa", tmpl: "{sa}{ns}.svc", wantErr: "{sa} must end the name or be followed by a '.'"},
		{name: "sa with prefix", tmpl: "x-{sa}.{ns}", wantErr: "{sa} must start the name or follow a '.'"},
		{name: "hyphen between", tmpl: "{sa}-{ns}.svc", wantErr: "must end the name or be followed by a '.'"},
		{name: "td glued", tmpl: "{sa}.{ns}.x{td}", wantErr: "{td} must start the name or follow a '.'"},
		{name: "trailing dot", tmpl: "{sa}.{ns}.svc.", wantErr: "empty label"},
		{name: "leading dot", tmpl: ".{sa}.{ns}.svc", wantErr: "empty label"},
		{name: "double dot", tmpl: "{sa}..{ns}.svc", wantErr: "empty label"},
		{name: "label starting with hyphen", tmpl: "{sa}.{ns}.-svc", wantErr: "starts or ends with '-'"},
		{name: "numeric last label", tmpl: "{sa}.{ns}.10", wantErr: "all digits"},
		{name: "long literal label", tmpl: "{sa}.{ns}." + strings.Repeat("a", 64), wantErr: "64 characters"},
		{name: "too long", tmpl: strings.Repeat("a.", 300) + "{sa}.{ns}.svc", wantErr: "at most 512"},
		{name: "td with underscore", tmpl: "{sa}.{ns}.{td}", td: "my_domain.org", wantErr: `trust domain "my_domain.org" is not a valid DNS name`},
		{name: "td with underscore unused", tmpl: "{sa}.{ns}.svc", td: "my_domain.org", want: "web.prod.svc"},
		{name: "td numeric", tmpl: "{sa}.{ns}.{td}", td: "10.0.0.1", wantErr: "all digits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := td
			if tc.td != "" {
				d = spiffeid.RequireTrustDomainFromString(tc.td)
			}
			tmpl, err := Parse(tc.tmpl, d)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Nil(t, tmpl)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.tmpl, tmpl.String())
			id := spiffeid.RequireFromPath(d, "/ns/prod/sa/web")
			names, err := tmpl.Names(id, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "prod/web"})
			require.NoError(t, err)
			assert.Equal(t, []string{tc.want}, names)
		})
	}
}

func TestZone(t *testing.T) {
	for tmpl, want := range map[string]string{
		"{sa}.{ns}.svc.cluster.local":  "svc.cluster.local",
		"{sa}.{ns}.{td}":               "example.org",
		"{sa}.{ns}.{td}.internal":      "example.org.internal",
		"{ns}.{sa}.mesh":               "mesh",
		"api.{sa}.x.{ns}.svc.internal": "svc.internal",
	} {
		t.Run(tmpl, func(t *testing.T) {
			tp, err := Parse(tmpl, td)
			require.NoError(t, err)
			assert.Equal(t, want, tp.Zone())
			names, err := tp.Names(spiffeid.RequireFromString("spiffe://example.org/ns/prod/sa/web"), authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "prod/web"})
			require.NoError(t, err)
			assert.True(t, strings.HasSuffix(names[0], "."+want), "%s is below the zone", names[0])
		})
	}
}

func TestParseNeedsTrustDomain(t *testing.T) {
	_, err := Parse("{sa}.{ns}", spiffeid.TrustDomain{})
	assert.ErrorContains(t, err, "no trust domain")
}

func TestNames(t *testing.T) {
	tmpl, err := Parse("{sa}.{ns}.svc.cluster.local", td)
	require.NoError(t, err)
	other := spiffeid.RequireTrustDomainFromString("other.org")
	kube := func(ref string) authn.Grant { return authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ref} }
	issuer := authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: "cluster-b"}
	for _, tc := range []struct {
		name    string
		id      spiffeid.ID
		g       authn.Grant
		want    []string
		wantErr string // "" with want nil: not applicable
	}{
		{name: "kubernetes-jwt", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: kube("prod/web"), want: []string{"web.prod.svc.cluster.local"}},
		{name: "kubernetes-issuer", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: issuer, want: []string{"web.prod.svc.cluster.local"}},
		{name: "bootstrap token", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: authn.Grant{Method: authn.MethodBootstrapToken, Ref: "abc"}},
		{name: "oidc", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: authn.Grant{Method: authn.MethodOIDC, Ref: "github"}},
		{name: "legacy", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: authn.Grant{Method: authn.GrantMethodLegacy}},
		{name: "sds minted", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: authn.Grant{Method: authn.GrantMethodSDS}},
		{name: "x509-svid is no grant method", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: authn.Grant{Method: authn.MethodX509SVID}},
		{name: "no grant", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web")},
		{name: "grant of another account", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: kube("prod/db"), wantErr: `grant names service account "prod/db"`},
		{name: "grant of another namespace", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: kube("dev/web"), wantErr: "grant names"},
		{name: "grant without ref", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web"), g: kube(""), wantErr: "grant names"},
		{name: "other trust domain", id: spiffeid.RequireFromPath(other, "/ns/prod/sa/web"), g: kube("prod/web"), wantErr: "not in trust domain"},
		{name: "not a service account path", id: spiffeid.RequireFromPath(td, "/workload/web"), g: issuer, wantErr: "not of the form"},
		{name: "longer path", id: spiffeid.RequireFromPath(td, "/ns/prod/sa/web/extra"), g: issuer, wantErr: "not of the form"},
		{name: "numeric namespace and account", id: spiffeid.RequireFromPath(td, "/ns/1/sa/2"), g: kube("1/2"), want: []string{"2.1.svc.cluster.local"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names, err := tmpl.Names(tc.id, tc.g)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrSkipped)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Nil(t, names)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, names)
		})
	}
}

// TestNamesInjection feeds namespace and service account values a token
// or a SPIFFE ID could carry that must not become (part of) a DNS name.
// Only IDs go-spiffe accepts reach Names, so each value is a valid path
// segment: [A-Za-z0-9._-].
func TestNamesInjection(t *testing.T) {
	tmpl, err := Parse("{sa}.{ns}.{td}", td)
	require.NoError(t, err)
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name, ns, sa, wantErr string
	}{
		{"dotted service account", "prod", "web.internal", `service account "web.internal": holds '.'`},
		{"dotted namespace", "prod.evil", "web", `namespace "prod.evil": holds '.'`},
		{"dots forging another name", "prod", "db.prod", "holds '.'"},
		{"uppercase service account", "prod", "Web", `character 'W' at offset 0`},
		{"uppercase namespace", "PROD", "web", "character 'P'"},
		{"underscore", "prod", "web_1", "character '_'"},
		{"leading hyphen", "prod", "-web", "starts or ends with '-'"},
		{"trailing hyphen", "prod-", "web", "starts or ends with '-'"},
		{"dot dot segment", "prod", "..x", "holds '.'"},
		{"64 characters", "prod", long, "label of 64 characters, at most 63"},
		{"very long", "prod", strings.Repeat("b", 253), "label of 253 characters"},
		{"name over 253", strings.Repeat("n", 63), strings.Repeat("s", 63), ""}, // fits: 63+1+63+1+11
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := spiffeid.FromPath(td, "/ns/"+tc.ns+"/sa/"+tc.sa)
			require.NoError(t, err)
			names, err := tmpl.Names(id, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: tc.ns + "/" + tc.sa})
			if tc.wantErr == "" {
				require.NoError(t, err)
				require.Len(t, names, 1)
				assert.NoError(t, CheckName(names[0]))
				return
			}
			assert.ErrorIs(t, err, ErrSkipped)
			assert.ErrorContains(t, err, tc.wantErr)
			assert.Nil(t, names)
		})
	}
	// Values go-spiffe refuses never reach Names: '*', '/', '%', unicode,
	// whitespace.
	for _, seg := range []string{"*", "we*b", "a%2eb", "wéb", "w b"} {
		_, err := spiffeid.FromPath(td, "/ns/prod/sa/"+seg)
		assert.Error(t, err, seg)
	}
}

// TestNamesTooLong: every label fits, the whole name does not.
func TestNamesTooLong(t *testing.T) {
	tmpl, err := Parse("{sa}.{ns}."+strings.Repeat("z", 63)+"."+strings.Repeat("y", 63), td)
	require.NoError(t, err)
	ns, sa := strings.Repeat("n", 63), strings.Repeat("s", 63)
	names, err := tmpl.Names(spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/"+sa), authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: "b"})
	assert.ErrorIs(t, err, ErrSkipped)
	assert.ErrorContains(t, err, "255 characters, at most 253")
	assert.Nil(t, names)
}

// TestNamesNumericLabels: all-digit values are fine inside the name; the
// last label, which would make it read as an IP address, is the fixed
// zone's (a template ending in a placeholder is refused, TestParse).
func TestNamesNumericLabels(t *testing.T) {
	tmpl, err := Parse("{ns}.{sa}.mesh", td)
	require.NoError(t, err)
	names, err := tmpl.Names(spiffeid.RequireFromPath(td, "/ns/prod/sa/123"), authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "prod/123"})
	require.NoError(t, err)
	assert.Equal(t, []string{"prod.123.mesh"}, names)
}

// TestNamesReserved: a workload never gets a name of the server's own
// certificate, whatever its service account is called.
func TestNamesReserved(t *testing.T) {
	tmpl, err := Parse("{sa}.{ns}.svc", td, "Istiod.istio-system.svc", "trustbridge.trustbridge.svc")
	require.NoError(t, err)
	for _, path := range []string{"/ns/istio-system/sa/istiod", "/ns/trustbridge/sa/trustbridge"} {
		id := spiffeid.RequireFromPath(td, path)
		ns, sa, _ := authn.ServiceAccountOf(id)
		names, err := tmpl.Names(id, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ns + "/" + sa})
		assert.ErrorIs(t, err, ErrSkipped)
		assert.ErrorContains(t, err, "reserved")
		assert.Nil(t, names)
	}
	names, err := tmpl.Names(spiffeid.RequireFromPath(td, "/ns/istio-system/sa/other"), authn.Grant{Method: authn.MethodKubernetesIssuer})
	require.NoError(t, err)
	assert.Equal(t, []string{"other.istio-system.svc"}, names)
}

func TestCheckName(t *testing.T) {
	for _, tc := range []struct{ name, wantErr string }{
		{"a", ""},
		{"web.prod.svc.cluster.local", ""},
		{"a-b.c1", ""},
		{"", "empty label"},
		{"a.", "empty label"},
		{"*.a", "character '*'"},
		{"A.b", "character 'A'"},
		{"a.1", "all digits"},
		{strings.Repeat("a.", 126) + "ab", "254 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckName(tc.name)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}
