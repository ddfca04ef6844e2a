package oidc

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn/idtemplate"
)

func TestParseTemplate(t *testing.T) {
	tests := []struct {
		tmpl      string
		segments  int
		literalTD string
		errHas    string
	}{
		{tmpl: "spiffe://{{.TrustDomain}}/ci", segments: 1},
		{tmpl: "spiffe://{{ .TrustDomain }}/ci/{{ .Claims.repository }}", segments: 2},
		{tmpl: "spiffe://{{.TrustDomain}}/ns/{{.Claims.kubernetes.io.namespace}}/sa/{{.Claims.kubernetes.io.serviceaccount.name}}", segments: 4},
		{tmpl: "spiffe://{{.TrustDomain}}/repo-{{.Claims.repository_id}}.v1/{{.Claims.ref_type}}", segments: 2},
		{tmpl: "spiffe://{{.TrustDomain}}/repo-{{.Claims.repository_id}}.{{.Claims.ref_type}}", errHas: "column 58: {{.Claims.ref_type}} is a second claim placeholder in one path segment"},
		{tmpl: "spiffe://{{.TrustDomain}}/ci/{{.Claims.org}}-{{.Claims.repo}}", errHas: "column 46: {{.Claims.repo}} is a second claim placeholder in one path segment, which is ambiguous"},
		{tmpl: "spiffe://{{.TrustDomain}}/ci/{{.Claims.org}}{{ .Claims.repo }}", errHas: "column 45: {{.Claims.repo}} is a second claim placeholder"},
		{tmpl: "spiffe://example.org/{{.Claims.a}}/x-{{.Claims.b}}-y/{{.Claims.c}}.{{.Claims.d}}", errHas: "column 68: {{.Claims.d}} is a second"},
		{tmpl: "spiffe://example.org/vm/{{.Claims.sub}}", segments: 2, literalTD: "example.org"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{.Claims.https://example.com/claims/tenant}}", segments: 2},
		{tmpl: "", errHas: "must start with spiffe://"},
		{tmpl: "spiffe://", errHas: "must start with spiffe://"},
		{tmpl: "spiffe://{{.TrustDomain}}", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.TrustDomain}}{{.Claims.a}}", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.TrustDomain}}/a/", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.TrustDomain}}/a b", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.TrustDomain}}/a%2Fb", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.TrustDomain}}/./{{.Claims.a}}", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.TrustDomain}}/{{.Claims.a}}/..", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{.Claims.}}", errHas: "column 29: {{.Claims.}}"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{.Claims..a}}", errHas: "empty key"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{.Claims.a b}}", errHas: "functions and pipelines are not supported"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{.claims.a}}", errHas: "is not {{.TrustDomain}} or {{.Claims.<claim>}}"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{ .Claims.a }", errHas: "column 29: {{ is not closed by }}"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{.Claims.a}}}", errHas: "stray '}'"},
		{tmpl: "spiffe://{.TrustDomain}/x", errHas: "column 10: stray '{'"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{if .Claims.a}}y{{end}}", errHas: "column 29:"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{template \"a\"}}", errHas: "column 29:"},
		{tmpl: "spiffe://{{.TrustDomain}}/x/{{.Claims.a|html}}", errHas: "column 29:"},
		{tmpl: "spiffe://{{.TrustDomain}}.evil.com/x", errHas: "non-root SPIFFE ID path"},
		{tmpl: "spiffe://{{.Claims.td}}/x", errHas: "must start with spiffe://"},
		{tmpl: "SPIFFE://{{.TrustDomain}}/x", errHas: "must start with spiffe://"},
		{tmpl: "spiffe://ex ample.org/x", errHas: "is not a trust domain followed by /"},
		{tmpl: "spiffe://example.org", errHas: "is not a trust domain followed by /"},
		{tmpl: "spiffe://example.org{{.TrustDomain}}/x", errHas: "is not a trust domain followed by /"},
		{tmpl: "spiffe://{{.TrustDomain}}/" + strings.Repeat("a", idtemplate.MaxTemplateLen), errHas: "more than 2048"},
	}
	for _, tt := range tests {
		t.Run(tt.tmpl, func(t *testing.T) {
			got, err := parseTemplate(tt.tmpl)
			if tt.errHas != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.errHas)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.segments, got.segments)
			assert.Equal(t, tt.literalTD, got.literalTD)
		})
	}
}

func TestTemplateTrustDomain(t *testing.T) {
	tmpl, err := parseTemplate("spiffe://other.org/x/{{.Claims.sub}}")
	require.NoError(t, err)
	err = tmpl.checkTrustDomain(testTD)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `template names trust domain "other.org", not this server's "example.org"`)

	tmpl, err = parseTemplate("spiffe://example.org/x/{{.Claims.sub}}")
	require.NoError(t, err)
	require.NoError(t, tmpl.checkTrustDomain(testTD))
	id, err := tmpl.execute(testTD, map[string]any{"sub": "vm-1"})
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/x/vm-1", id.String())
}

// claimsJSON decodes a claims document as verify does.
func claimsJSON(t testing.TB, doc string) map[string]any {
	t.Helper()
	m, err := decodeObject([]byte(doc))
	require.NoError(t, err)
	return m
}

// TestTemplateClaimInjection feeds hostile claim values to a template:
// the result is an ID in the trust domain with exactly the template's
// segments, or a refusal; never an extra segment or another trust domain.
func TestTemplateClaimInjection(t *testing.T) {
	tmpl, err := parseTemplate("spiffe://{{.TrustDomain}}/ci/{{.Claims.v}}/x")
	require.NoError(t, err)
	long := strings.Repeat("a", idtemplate.MaxSegmentLen)
	tests := []struct {
		name, claims string
		want         string // "" means refused
		errHas       string
	}{
		{"plain", `{"v":"acme"}`, "spiffe://example.org/ci/acme/x", ""},
		{"dots and dashes", `{"v":"a.b-c_d"}`, "spiffe://example.org/ci/a.b-c_d/x", ""},
		{"three dots", `{"v":"..."}`, "spiffe://example.org/ci/.../x", ""},
		{"number", `{"v":12345}`, "spiffe://example.org/ci/12345/x", ""},
		{"negative float number", `{"v":-1.5e3}`, "spiffe://example.org/ci/-1.5e3/x", ""},
		{"longest value", `{"v":"` + long + `"}`, "spiffe://example.org/ci/" + long + "/x", ""},
		{"slash", `{"v":"acme/evil"}`, "", `byte 5 is not one of`},
		{"leading slash", `{"v":"/evil"}`, "", "byte 1 is not one of"},
		{"dot-dot", `{"v":".."}`, "", "relative path segment"},
		{"dot", `{"v":"."}`, "", "relative path segment"},
		{"dot-dot slash", `{"v":"../../other"}`, "", "is not one of"},
		{"percent slash", `{"v":"a%2Fb"}`, "", "is not one of"},
		{"percent dots", `{"v":"%2e%2e"}`, "", "is not one of"},
		{"space", `{"v":"a b"}`, "", "is not one of"},
		{"tab", `{"v":"a\tb"}`, "", "is not one of"},
		{"newline", `{"v":"a\nb"}`, "", "is not one of"},
		{"nul", `{"v":"a\u0000b"}`, "", "is not one of"},
		{"fullwidth solidus", `{"v":"a／b"}`, "", "is not one of"},
		{"division slash", `{"v":"a∕b"}`, "", "is not one of"},
		{"unicode dots", `{"v":"‥"}`, "", "is not one of"},
		{"cyrillic look-alike", `{"v":"аcme"}`, "", "is not one of"},
		{"trust domain escape", `{"v":"@other.org"}`, "", "is not one of"},
		{"query", `{"v":"a?b"}`, "", "is not one of"},
		{"fragment", `{"v":"a#b"}`, "", "is not one of"},
		{"colon", `{"v":"spiffe:"}`, "", "is not one of"},
		{"empty", `{"v":""}`, "", "value is empty"},
		{"too long", `{"v":"` + long + `a"}`, "", "more than 255"},
		{"object", `{"v":{"a":"b"}}`, "", "is an object, not a string or number"},
		{"array", `{"v":["a"]}`, "", "is an array"},
		{"boolean", `{"v":true}`, "", "is a boolean"},
		{"null", `{"v":null}`, "", "is null"},
		{"missing", `{"w":"a"}`, "", `claim "v" is missing`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := tmpl.execute(testTD, claimsJSON(t, tt.claims))
			if tt.want == "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.errHas)
				assert.True(t, id.IsZero())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, id.String())
		})
	}
}

// TestTemplateDottedKeys resolves claims whose keys contain dots.
func TestTemplateDottedKeys(t *testing.T) {
	tmpl, err := parseTemplate("spiffe://{{.TrustDomain}}/ns/{{.Claims.kubernetes.io.namespace}}/sa/{{.Claims.kubernetes.io.serviceaccount.name}}")
	require.NoError(t, err)
	tests := []struct {
		name, claims, want, errHas string
	}{
		{"nested under a dotted key", `{"kubernetes.io":{"namespace":"prod","serviceaccount":{"name":"web"}}}`, "spiffe://example.org/ns/prod/sa/web", ""},
		{"flat dotted keys", `{"kubernetes.io.namespace":"prod","kubernetes.io.serviceaccount.name":"web"}`, "spiffe://example.org/ns/prod/sa/web", ""},
		{"fully nested", `{"kubernetes":{"io":{"namespace":"prod","serviceaccount":{"name":"web"}}}}`, "spiffe://example.org/ns/prod/sa/web", ""},
		{"two nestings are ambiguous", `{"kubernetes.io":{"namespace":"long","serviceaccount":{"name":"web"}},"kubernetes":{"io":{"namespace":"short"}}}`, "", `claim "kubernetes.io.namespace" is ambiguous`},
		{"flat and nested are ambiguous", `{"kubernetes.io.namespace":"prod","kubernetes.io":{"namespace":"dev","serviceaccount":{"name":"web"}}}`, "", `claim "kubernetes.io.namespace" is ambiguous`},
		{"flat and nested are ambiguous even when equal", `{"kubernetes.io.namespace":"prod","kubernetes.io":{"namespace":"prod","serviceaccount":{"name":"web"}}}`, "", "is ambiguous"},
		{"a null nesting still counts", `{"kubernetes.io.namespace":"prod","kubernetes":{"io":{"namespace":null}},"kubernetes.io":{"serviceaccount":{"name":"web"}}}`, "", "is ambiguous"},
		{"an unrelated dotted key is no ambiguity", `{"kubernetes.io":{"namespace":"prod","serviceaccount":{"name":"web"}},"kubernetes.io.pod":"x","kubernetes":{"io":{"pod":"y"}}}`, "spiffe://example.org/ns/prod/sa/web", ""},
		{"falls back when the longest leads nowhere", `{"kubernetes.io":{"serviceaccount":{"name":"web"}},"kubernetes":{"io":{"namespace":"short"}}}`, "spiffe://example.org/ns/short/sa/web", ""},
		{"value with a slash under a dotted key", `{"kubernetes.io":{"namespace":"a/b","serviceaccount":{"name":"web"}}}`, "", "is not one of"},
		{"missing", `{"kubernetes.io":{"namespace":"prod"}}`, "", `claim "kubernetes.io.serviceaccount.name" is missing`},
		{"not an object on the way", `{"kubernetes.io":"prod"}`, "", "is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := tmpl.execute(testTD, claimsJSON(t, tt.claims))
			if tt.errHas != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.errHas)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, id.String())
		})
	}
}

func TestTemplateResultTooLong(t *testing.T) {
	var b strings.Builder
	b.WriteString("spiffe://{{.TrustDomain}}")
	for range 9 {
		b.WriteString("/{{.Claims.v}}")
	}
	tmpl, err := parseTemplate(b.String())
	require.NoError(t, err)
	_, err = tmpl.execute(testTD, map[string]any{"v": strings.Repeat("a", idtemplate.MaxSegmentLen)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "more than 2048")
}

func TestClaimRules(t *testing.T) {
	rules := []ClaimRule{
		{Claim: "repository_owner", Values: []string{"acme", "umbrella"}},
		{Claim: "repository_id", Values: []string{"42"}},
		{Claim: "kubernetes.io.namespace", Values: []string{"prod"}},
		{Claim: "public", Values: []string{"false"}},
	}
	good := func() map[string]any {
		return claimsJSON(t, `{"repository_owner":"acme","repository_id":42,"kubernetes.io":{"namespace":"prod"},"public":false}`)
	}
	require.NoError(t, checkRulesHold(rules, good()))
	tests := []struct {
		name   string
		mutate func(map[string]any)
		errHas string
	}{
		{"other value", func(m map[string]any) { m["repository_owner"] = "evil" }, `claim "repository_owner" is "evil", not one of the 2 allowed values`},
		{"case differs", func(m map[string]any) { m["repository_owner"] = "ACME" }, "not one of"},
		{"missing", func(m map[string]any) { delete(m, "repository_owner") }, `claim "repository_owner" is missing`},
		{"number differs", func(m map[string]any) { m["repository_id"] = json.Number("42.0") }, `"42.0", not one of`},
		{"string for a number", func(m map[string]any) { m["repository_id"] = "42" }, ""},
		{"nested differs", func(m map[string]any) { m["kubernetes.io"] = map[string]any{"namespace": "dev"} }, "not one of"},
		{"array", func(m map[string]any) { m["repository_owner"] = []any{"acme"} }, "is an array, not a string"},
		{"null", func(m map[string]any) { m["repository_owner"] = nil }, "is null"},
		{"bool differs", func(m map[string]any) { m["public"] = true }, `"true", not one of`},
		{"flat key beside the nested one", func(m map[string]any) { m["kubernetes.io.namespace"] = "prod" }, `claim rule: claim "kubernetes.io.namespace" is ambiguous`},
		{"flat key with the allowed value, nested another", func(m map[string]any) {
			m["kubernetes.io.namespace"] = "prod"
			m["kubernetes.io"] = map[string]any{"namespace": "dev"}
		}, "is ambiguous"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.mutate(c)
			err := checkRulesHold(rules, c)
			if tt.errHas == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}
}

// FuzzTemplate parses a template and executes it with fuzzed claims: the
// result is an error or a SPIFFE ID in the trust domain with exactly the
// template's number of path segments.
func FuzzTemplate(f *testing.F) {
	f.Add("spiffe://{{.TrustDomain}}/ci/{{.Claims.v}}", `{"v":"acme"}`)
	f.Add("spiffe://{{.TrustDomain}}/ci/{{.Claims.v}}", `{"v":"a/b"}`)
	f.Add("spiffe://{{.TrustDomain}}/ci/{{.Claims.v}}{{.Claims.v}}", `{"v":"."}`)
	f.Add("spiffe://{{.TrustDomain}}/ci/{{.Claims.v}}/x.{{.Claims.v}}", `{"v":"."}`)
	f.Add("spiffe://{{.TrustDomain}}/ci/.{{.Claims.v}}", `{"v":"."}`)
	f.Add("spiffe://example.org/{{.Claims.a.b}}", `{"a.b":"x","a":{"b":"y"}}`)
	f.Add("spiffe://{{.TrustDomain}}/ns/{{.Claims.kubernetes.io.namespace}}", `{"kubernetes.io":{"namespace":"%2e%2e"}}`)
	f.Add("spiffe://{{.TrustDomain}}/{{.Claims.n}}", `{"n":1e400}`)
	f.Add("spiffe://{{.TrustDomain}}/{{.Claims.n}}", `{"n":-0}`)
	f.Fuzz(func(t *testing.T, tmplSrc, claimsDoc string) {
		tmpl, err := parseTemplate(tmplSrc)
		if err != nil {
			return
		}
		if tmpl.checkTrustDomain(testTD) != nil {
			return
		}
		d := json.NewDecoder(bytes.NewReader([]byte(claimsDoc)))
		d.UseNumber()
		var claims map[string]any
		if d.Decode(&claims) != nil {
			return
		}
		id, err := tmpl.execute(testTD, claims)
		if err != nil {
			return
		}
		again, perr := spiffeid.FromString(id.String())
		require.NoError(t, perr)
		require.Equal(t, testTD, again.TrustDomain())
		require.Equal(t, tmpl.segments, strings.Count(id.Path(), "/"), "id %s", id)
		require.NotEmpty(t, id.Path())
	})
}
