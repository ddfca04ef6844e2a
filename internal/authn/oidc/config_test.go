package oidc

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const goodConfig = `issuers:
- name: github-actions
  kind: oidc
  issuer: https://token.actions.githubusercontent.com
  audiences: [spiffe://example.org]
  algorithms: [RS256]
  caFile: /etc/trustbridge/issuer-ca.pem
  allowPrivateAddresses: false
  claims:
  - claim: repository_owner
    values: [acme]
  - claim: ref
    values: [refs/heads/main, refs/heads/release]
  spiffeID: "spiffe://{{.TrustDomain}}/ci/{{.Claims.repository_owner}}/{{.Claims.workflow}}"
  maxRenewalLifetime: 90m
- name: cluster-west
  kind: kubernetes
  issuer: https://oidc.west.example.net/
  audiences: [trustbridge, other]
  allowPrivateAddresses: true
- name: vm
  issuer: https://idp.example.com:8443/realms/vms
  audiences: [trustbridge]
  claims:
  - claim: azp
    values: [vm-fleet]
  spiffeID: spiffe://example.org/vm/{{ .Claims.kubernetes.io.namespace }}
`

func TestParseConfigAccepts(t *testing.T) {
	got, err := ParseConfig([]byte(goodConfig))
	require.NoError(t, err)
	want := []IssuerConfig{
		{
			Name: "github-actions", Kind: KindOIDC, Issuer: "https://token.actions.githubusercontent.com",
			Audiences: []string{"spiffe://example.org"}, Algorithms: []string{"RS256"},
			CAFile: "/etc/trustbridge/issuer-ca.pem",
			Claims: []ClaimRule{
				{Claim: "repository_owner", Values: []string{"acme"}},
				{Claim: "ref", Values: []string{"refs/heads/main", "refs/heads/release"}},
			},
			SPIFFEID:           "spiffe://{{.TrustDomain}}/ci/{{.Claims.repository_owner}}/{{.Claims.workflow}}",
			MaxRenewalLifetime: 90 * time.Minute,
			Line:               2,
		},
		{
			Name: "cluster-west", Kind: KindKubernetes, Issuer: "https://oidc.west.example.net/",
			Audiences: []string{"trustbridge", "other"}, AllowPrivateAddresses: true,
			Line: 16,
		},
		{
			Name: "vm", Kind: KindOIDC, Issuer: "https://idp.example.com:8443/realms/vms",
			Audiences: []string{"trustbridge"},
			Claims:    []ClaimRule{{Claim: "azp", Values: []string{"vm-fleet"}}},
			SPIFFEID:  "spiffe://example.org/vm/{{ .Claims.kubernetes.io.namespace }}",
			Line:      21,
		},
	}
	assert.Equal(t, want, got)

	// What ParseConfig accepts, New accepts (defaults applied there).
	_, err = New(Config{TrustDomain: testTD, Issuers: got, newKeys: func(IssuerConfig) (keySource, error) { return &fakeKeys{}, nil }})
	require.NoError(t, err)
}

func TestParseConfigEmpty(t *testing.T) {
	for _, doc := range []string{"", "# nothing\n", "~\n", "issuers:\n", "issuers: []\n"} {
		t.Run(doc, func(t *testing.T) {
			got, err := ParseConfig([]byte(doc))
			require.NoError(t, err)
			assert.Empty(t, got)
		})
	}
}

// issuerDoc is a one-issuer document whose issuer has body's lines
// (indented by the caller's two spaces) after its name on line 2.
func issuerDoc(body string) string {
	return "issuers:\n- name: x\n" + body
}

const okBody = "  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/x/{{.Claims.sub}}\n"

// okRule completes okBody to a valid oidc issuer: kind oidc needs a rule.
const okRule = "  claims: [{claim: azp, values: [a]}]\n"

func TestParseConfigRefuses(t *testing.T) {
	tooManyAuds := "[" + strings.Repeat("a,", 16) + "b]"
	var dupAuds []string
	for i := range 17 {
		dupAuds = append(dupAuds, fmt.Sprintf("a%d", i))
	}
	tests := []struct {
		name, doc string
		line      int
		errHas    string
	}{
		{"unknown top key", "issuer:\n- name: x\n", 1, `unknown key "issuer" in the top level`},
		{"unknown issuer key", issuerDoc(okBody + "  spiffeId: x\n"), 6, `unknown key "spiffeId" in issuers[0] (did you mean "spiffeID"?)`},
		{"unknown rule key", issuerDoc(okBody + "  claims:\n  - claim: a\n    value: [x]\n"), 8, `unknown key "value" in issuers[0].claims[0]`},
		{"duplicate key", issuerDoc(okBody + "  issuer: https://j.test\n"), 6, `duplicate key "issuer" in issuers[0] (first at line 3)`},
		{"duplicate name", issuerDoc(okBody+okRule) + "- name: x\n  issuer: https://j.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/y/{{.Claims.sub}}\n" + okRule, 7, `issuers[1]: name "x" is already used at line 2`},
		{"bad name", "issuers:\n- name: Bad_Name\n" + okBody, 2, "issuers[0].name: issuer name \"Bad_Name\" must be"},
		{"name with trailing dash", "issuers:\n- name: x-\n" + okBody, 2, "issuer name"},
		{"name not a string", "issuers:\n- name: 12\n" + okBody, 2, `issuers[0].name must be a string, got !!int "12"`},
		{"missing issuer", "issuers:\n- name: x\n  audiences: [a]\n", 2, `issuers[0]: missing required key "issuer"`},
		{"missing audiences", "issuers:\n- name: x\n  issuer: https://i.test\n", 2, `missing required key "audiences"`},
		{"http issuer", issuerDoc("  issuer: http://i.test\n  audiences: [a]\n"), 3, "must use https"},
		{"issuer with userinfo", issuerDoc("  issuer: https://user:pw@i.test\n  audiences: [a]\n"), 3, "must not carry userinfo"},
		{"issuer with query", issuerDoc("  issuer: https://i.test/?a=b\n  audiences: [a]\n"), 3, "must not have a query or fragment"},
		{"issuer with empty query", issuerDoc("  issuer: https://i.test/?\n  audiences: [a]\n"), 3, "must not have a query or fragment"},
		{"issuer with fragment", issuerDoc("  issuer: https://i.test/#f\n  audiences: [a]\n"), 3, "must not have a query or fragment"},
		{"issuer without host", issuerDoc("  issuer: https:///path\n  audiences: [a]\n"), 3, "has no host"},
		{"issuer relative", issuerDoc("  issuer: i.test\n  audiences: [a]\n"), 3, "must use https"},
		{"no audiences", issuerDoc("  issuer: https://i.test\n  audiences: []\n"), 4, "must list 1 to 16 audiences, got 0"},
		{"audiences not a list", issuerDoc("  issuer: https://i.test\n  audiences: a\n"), 4, "issuers[0].audiences must be a list"},
		{"too many audiences", issuerDoc("  issuer: https://i.test\n  audiences: " + tooManyAuds + "\n"), 4, "must list 1 to 16 audiences, got 17"},
		{"17 distinct audiences", issuerDoc("  issuer: https://i.test\n  audiences: [" + strings.Join(dupAuds, ", ") + "]\n"), 4, "got 17"},
		{"empty audience", issuerDoc("  issuer: https://i.test\n  audiences: ['']\n"), 4, "audience 0 must be 1 to"},
		{"audience twice", issuerDoc("  issuer: https://i.test\n  audiences: [a, a]\n"), 4, `audience "a" is listed twice`},
		{"HS256", issuerDoc(okBody + "  algorithms: [RS256, HS256]\n"), 6, `algorithm "HS256" is not allowed`},
		{"none", issuerDoc(okBody + "  algorithms: [none]\n"), 6, `algorithm "none" is not allowed`},
		{"lowercase alg", issuerDoc(okBody + "  algorithms: [rs256]\n"), 6, `algorithm "rs256" is not allowed`},
		{"empty algorithms", issuerDoc(okBody + "  algorithms: []\n"), 6, "leave it out for the default RS256, ES256"},
		{"bad kind", issuerDoc(okBody + "  kind: saml\n"), 6, "issuers[0].kind: is not one of oidc, kubernetes"},
		{"template for kubernetes kind", issuerDoc(okBody + "  kind: kubernetes\n"), 5, "spiffeID is not allowed for kind kubernetes"},
		{"template missing for oidc", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n"), 2, "kind oidc requires spiffeID"},
		{"template unknown placeholder", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/{{.Foo}}\n"), 5, "column 27: {{.Foo}} is not {{.TrustDomain}} or {{.Claims.<claim>}}"},
		{"template unclosed", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/{{.Claims.sub\n"), 5, "column 27: {{ is not closed by }}"},
		{"template function call", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: 'spiffe://{{.TrustDomain}}/{{printf \"%s\" .Claims.sub}}'\n"), 5, "column 27:"},
		{"template pipeline", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: 'spiffe://{{.TrustDomain}}/{{.Claims.sub | lower}}'\n"), 5, "functions and pipelines are not supported"},
		{"template not spiffe", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: https://{{.TrustDomain}}/x\n"), 5, "must start with spiffe://{{.TrustDomain}}/"},
		{"template claim as trust domain", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.Claims.td}}/x\n"), 5, "must start with spiffe://{{.TrustDomain}}/"},
		{"template bad literal td", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://Example.ORG/x/{{.Claims.a}}\n"), 5, "is not a trust domain followed by /"},
		{"template root path", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/\n"), 5, "non-root SPIFFE ID path"},
		{"template dot-dot literal", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/../{{.Claims.a}}\n"), 5, "non-root SPIFFE ID path"},
		{"template empty segment", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/a//{{.Claims.a}}\n"), 5, "non-root SPIFFE ID path"},
		{"template td in path", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/{{.TrustDomain}}\n"), 5, "only allowed as the trust domain"},
		{"template two claims in one segment", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/ci/{{.Claims.org}}-{{.Claims.repo}}\n"), 5, "issuers[0].spiffeID: column 46: {{.Claims.repo}} is a second claim placeholder in one path segment"},
		{"template stray brace", issuerDoc("  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/a}\n"), 5, "column 28: stray '}'"},
		{"claim rule without values", issuerDoc(okBody + "  claims:\n  - claim: ref\n    values: []\n"), 8, "issuers[0].claims[0].values: must list at least one value"},
		{"claim rule missing values", issuerDoc(okBody + "  claims:\n  - claim: ref\n"), 7, `issuers[0].claims[0]: missing required key "values"`},
		{"claim rule bad path", issuerDoc(okBody + "  claims:\n  - claim: a..b\n    values: [x]\n"), 7, "has an empty key"},
		{"claim rule twice", issuerDoc(okBody + "  claims:\n  - claim: ref\n    values: [x]\n  - claim: ref\n    values: [y]\n"), 9, `claim "ref" already has a rule at line 7`},
		{"claim value not a string", issuerDoc(okBody + "  claims:\n  - claim: ref\n    values: [true]\n"), 8, "quote it"},
		{"duplicate issuer URL", issuerDoc(okBody+okRule) + "- name: y\n  issuer: https://i.test\n  audiences: [b]\n  spiffeID: spiffe://{{.TrustDomain}}/y/{{.Claims.sub}}\n" + okRule, 8, `issuers[1]: issuer "https://i.test" is already configured at line 3`},
		{"allowPrivateAddresses not bool", issuerDoc(okBody + "  allowPrivateAddresses: 'yes'\n"), 6, "must be true or false"},
		{"empty caFile", issuerDoc(okBody + "  caFile: ''\n"), 6, "caFile: is empty"},
		{"anchor", "issuers:\n- &i\n  name: x\n", 2, "anchors and aliases are not supported"},
		{"alias", "a: &a x\nissuers: *a\n", 1, "anchors and aliases are not supported"},
		{"issuers not a list", "issuers: {name: x}\n", 1, "issuers must be a list, got a mapping"},
		{"issuer not a mapping", "issuers:\n- x\n", 2, "issuers[0] must be a mapping"},
		{"second document", "issuers: []\n---\nissuers: []\n", 2, "a second YAML document"},
		{"merge key", issuerDoc(okBody + "  <<: {a: b}\n"), 6, "merge keys"},
		{"maxRenewalLifetime zero", issuerDoc(okBody + okRule + "  maxRenewalLifetime: 0s\n"), 7, "issuers[0].maxRenewalLifetime: must be more than 0 and at most 8760h (a year), got 0s; leave it out for the default 24h"},
		{"maxRenewalLifetime negative", issuerDoc(okBody + okRule + "  maxRenewalLifetime: -1h\n"), 7, "must be more than 0"},
		{"maxRenewalLifetime over a year", issuerDoc(okBody + okRule + "  maxRenewalLifetime: 8761h\n"), 7, "at most 8760h (a year), got 8761h0m0s"},
		{"maxRenewalLifetime not a duration", issuerDoc(okBody + okRule + "  maxRenewalLifetime: 1d\n"), 7, `issuers[0].maxRenewalLifetime: "1d" is not a duration such as 24h or 90m`},
		{"maxRenewalLifetime a number", issuerDoc(okBody + okRule + "  maxRenewalLifetime: 3600\n"), 7, "issuers[0].maxRenewalLifetime must be a string"},
		{"oidc without claims", issuerDoc(okBody), 2, "issuers[0]: kind oidc requires at least one claims rule: a shared public issuer (GitHub Actions, GitLab, a cloud) signs tokens with any audience for anyone"},
		{"oidc with empty claims", issuerDoc(okBody + "  claims: []\n"), 6, "e.g. claim repository_owner_id"},
		{"only rule on iss", issuerDoc(okBody + "  claims:\n  - claim: iss\n    values: [https://i.test]\n"), 7, `claim "iss" cannot have a rule`},
		{"rule on aud", issuerDoc(okBody + "  claims:\n  - claim: aud\n    values: [a]\n"), 7, `claim "aud" cannot have a rule`},
		{"rule on exp", issuerDoc(okBody + "  claims:\n  - claim: exp\n    values: [\"1\"]\n"), 7, `claim "exp" cannot have a rule`},
		{"oidc by default without claims", "issuers:\n- name: x\n  kind: oidc\n  issuer: https://i.test\n  audiences: [a]\n  spiffeID: spiffe://{{.TrustDomain}}/x/{{.Claims.sub}}\n", 2, "requires at least one claims rule"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.doc))
			require.Error(t, err)
			assert.Contains(t, err.Error(), fmt.Sprintf("authn: oidc: line %d: ", tt.line))
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}
}

func TestParseConfigSyntaxError(t *testing.T) {
	_, err := ParseConfig([]byte("issuers: [\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "authn: oidc: yaml:")
}

// TestParseConfigNode reads the value of the oidc key of a larger file:
// errors give that file's lines.
func TestParseConfigNode(t *testing.T) {
	file := "trustDomain: example.org\noidc:\n  issuers:\n  - name: x\n    issuer: https://i.test\n    audiences: [a]\n    kind: kubernetes\n"
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte(file), &doc))
	oidcNode := doc.Content[0].Content[3]
	got, err := ParseConfigNode(oidcNode)
	require.NoError(t, err)
	assert.Equal(t, []IssuerConfig{{Name: "x", Kind: KindKubernetes, Issuer: "https://i.test", Audiences: []string{"a"}, Line: 4}}, got)

	bad := strings.Replace(file, "https://i.test", "http://i.test", 1)
	require.NoError(t, yaml.Unmarshal([]byte(bad), &doc))
	_, err = ParseConfigNode(doc.Content[0].Content[3])
	require.Error(t, err)
	assert.Contains(t, err.Error(), "authn: oidc: line 5: issuers[0].issuer:")

	got, err = ParseConfigNode(nil)
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestParseConfigLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString("issuers:\n")
	for i := range maxIssuers + 1 {
		fmt.Fprintf(&b, "- name: i%d\n  issuer: https://i%d.test\n  audiences: [a]\n  kind: kubernetes\n", i, i)
	}
	_, err := ParseConfig([]byte(b.String()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("issuers has %d entries, more than %d", maxIssuers+1, maxIssuers))

	b.Reset()
	b.WriteString(issuerDoc(okBody + "  claims:\n"))
	for i := range maxClaimRules + 1 {
		fmt.Fprintf(&b, "  - claim: c%d\n    values: [x]\n", i)
	}
	_, err = ParseConfig([]byte(b.String()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "more than 32")
}

// TestIssuerConfigCheck covers the checks New makes on a configuration
// built in code, which ParseConfig's errors already cover for files.
func TestIssuerConfigCheck(t *testing.T) {
	base := func() IssuerConfig {
		return IssuerConfig{
			Name: "x", Issuer: "https://i.test", Audiences: []string{"a"},
			Claims:   []ClaimRule{{Claim: "azp", Values: []string{"a"}}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/x/{{.Claims.sub}}",
		}
	}
	tests := []struct {
		name   string
		mutate func(*IssuerConfig)
		errHas string
	}{
		{"ok", func(*IssuerConfig) {}, ""},
		{"bad name", func(c *IssuerConfig) { c.Name = "X" }, "name: issuer name"},
		{"bad kind", func(c *IssuerConfig) { c.Kind = "saml" }, `kind "saml" is not one of`},
		{"http", func(c *IssuerConfig) { c.Issuer = "http://i.test" }, "must use https"},
		{"no audiences", func(c *IssuerConfig) { c.Audiences = nil }, "got 0"},
		{"HS256", func(c *IssuerConfig) { c.Algorithms = []string{"HS256"} }, `"HS256" is not allowed`},
		{"template for kubernetes", func(c *IssuerConfig) { c.Kind = KindKubernetes }, "not allowed for kind kubernetes"},
		{"no template", func(c *IssuerConfig) { c.SPIFFEID = "" }, "requires spiffeID"},
		{"rule without values", func(c *IssuerConfig) { c.Claims = []ClaimRule{{Claim: "a"}} }, "must list at least one value"},
		{"oidc without rules", func(c *IssuerConfig) { c.Claims = nil }, "claims: kind oidc requires at least one claims rule"},
		{"only a rule on iss", func(c *IssuerConfig) { c.Claims = []ClaimRule{{Claim: "iss", Values: []string{c.Issuer}}} }, `claim "iss" cannot have a rule`},
		{"negative maxRenewalLifetime", func(c *IssuerConfig) { c.MaxRenewalLifetime = -time.Hour }, "maxRenewalLifetime: must be more than 0"},
		{"maxRenewalLifetime over a year", func(c *IssuerConfig) { c.MaxRenewalLifetime = MaxMaxRenewalLifetime + time.Nanosecond }, "at most 8760h"},
		{"rule twice", func(c *IssuerConfig) {
			c.Claims = []ClaimRule{{Claim: "a", Values: []string{"x"}}, {Claim: "a", Values: []string{"y"}}}
		}, "two rules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mutate(&c)
			err := c.check()
			if tt.errHas == "" {
				require.NoError(t, err)
				assert.Equal(t, KindOIDC, c.Kind)
				assert.Equal(t, []string{"RS256", "ES256"}, c.Algorithms)
				assert.Equal(t, DefaultMaxRenewalLifetime, c.MaxRenewalLifetime)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}

	// A cluster's issuer keeps rules optional (Istio multi-cluster shares
	// namespaces and service accounts across clusters).
	kube := IssuerConfig{Name: "west", Kind: KindKubernetes, Issuer: "https://k.test", Audiences: []string{"a"}}
	require.NoError(t, kube.check())
}

// TestNewNamesConfigLine: what only New can check (the template's trust
// domain) names the issuer's line in the file it came from.
func TestNewNamesConfigLine(t *testing.T) {
	doc := "issuers:\n- name: k\n  kind: kubernetes\n  issuer: https://k.test\n  audiences: [a]\n" +
		"- name: ci\n  issuer: https://i.test\n  audiences: [a]\n  claims: [{claim: azp, values: [a]}]\n" +
		"  spiffeID: spiffe://other.org/ci/{{.Claims.sub}}\n"
	issuers, err := ParseConfig([]byte(doc))
	require.NoError(t, err)
	require.Len(t, issuers, 2)
	assert.Equal(t, 6, issuers[1].Line)
	_, err = New(Config{TrustDomain: testTD, Issuers: issuers, newKeys: func(IssuerConfig) (keySource, error) { return &fakeKeys{}, nil }})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `authn: oidc: issuer "ci" (line 6): spiffeID: template names trust domain "other.org"`)
}

// TestDocExample: the configuration the package doc shows parses and
// builds, so the example readers copy is one the server accepts.
func TestDocExample(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var yamlLines []string
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		switch {
		case line == "//\tissuers:":
			in = true
		case in && !strings.HasPrefix(line, "//\t"):
			in = false
		}
		if in {
			yamlLines = append(yamlLines, strings.TrimPrefix(line, "//\t"))
		}
	}
	require.NotEmpty(t, yamlLines, "doc.go has no configuration example")
	issuers, err := ParseConfig([]byte(strings.Join(yamlLines, "\n")))
	require.NoError(t, err)
	require.Len(t, issuers, 2)
	for _, ic := range issuers {
		assert.NotEmpty(t, ic.Claims, "%s: the example shows a rule for every issuer", ic.Name)
	}
	_, err = New(Config{TrustDomain: testTD, Issuers: issuers, newKeys: func(IssuerConfig) (keySource, error) { return &fakeKeys{}, nil }})
	require.NoError(t, err)

	// With claims shaped like a GitHub Actions token's.
	github := claimsJSON(t, `{"repository":"acme/app","repository_id":"892375","repository_owner":"acme",`+
		`"repository_owner_id":"1234567","ref":"refs/heads/main","sub":"repo:acme/app:ref:refs/heads/main","workflow":"Build"}`)
	require.NoError(t, checkRulesHold(issuers[0].Claims, github))
	tmpl, err := parseTemplate(issuers[0].SPIFFEID)
	require.NoError(t, err)
	id, err := tmpl.execute(testTD, github)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ci/github/1234567/892375", id.String())
	for _, claim := range []string{"repository", "sub"} {
		bad, err := parseTemplate("spiffe://{{.TrustDomain}}/ci/{{.Claims." + claim + "}}")
		require.NoError(t, err)
		_, err = bad.execute(testTD, github)
		assert.ErrorContains(t, err, "is not one of A-Z a-z 0-9 . - _", "as the doc says, %s cannot be a template value", claim)
	}
}
