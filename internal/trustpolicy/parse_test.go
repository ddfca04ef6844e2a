package trustpolicy

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const goodPolicy = `default: deny
rules:
- name: payments-to-partner
  workloads:
  - spiffeID: spiffe://example.org/ns/payments/*
  - namespace: payments
    labels:
      matchLabels: {tier: api}
      matchExpressions:
      - {key: env, operator: In, values: [prod, staging]}
  trustDomains:
  - name: partner.example
    peers: [spiffe://partner.example/ns/billing/sa/api, spiffe://partner.example/ns/ops/*]
- name: ops
  workloads:
  - spiffeID: spiffe://example.org/ns/ops/sa/admin
  trustDomains:
  - name: partner.example
  - name: other.example
`

func TestParse(t *testing.T) {
	doc, err := Parse([]byte(goodPolicy), "file:policy.yaml")
	require.NoError(t, err)
	assert.Equal(t, DefaultDeny, doc.Default)
	require.Len(t, doc.Rules, 2)
	assert.Equal(t, Rule{
		Name:   "payments-to-partner",
		Origin: "file:policy.yaml:3",
		Workloads: []Selector{
			{SPIFFEID: "spiffe://example.org/ns/payments/*"},
			{Namespace: "payments", Labels: &metav1.LabelSelector{
				MatchLabels:      map[string]string{"tier": "api"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "staging"}}},
			}},
		},
		TrustDomains: []TrustDomainGrant{{TrustDomain: "partner.example", Peers: []string{"spiffe://partner.example/ns/billing/sa/api", "spiffe://partner.example/ns/ops/*"}}},
	}, doc.Rules[0])
	assert.Equal(t, "file:policy.yaml:14", doc.Rules[1].Origin)
	assert.Equal(t, []TrustDomainGrant{{TrustDomain: "partner.example"}, {TrustDomain: "other.example"}}, doc.Rules[1].TrustDomains)

	_, err = Compile(spiffeid.RequireTrustDomainFromString("example.org"), doc.Default, doc.Rules)
	require.NoError(t, err, "what Parse accepts, Compile accepts for the right local trust domain")
}

func TestParseEmpty(t *testing.T) {
	for _, s := range []string{"", "---\n", "# nothing\n", "null\n", "rules: []\n", "rules:\n"} {
		doc, err := Parse([]byte(s), "file:p")
		require.NoError(t, err, "%q", s)
		assert.Empty(t, doc.Rules)
		assert.Equal(t, Default(""), doc.Default)
	}
}

func TestParseErrors(t *testing.T) {
	rule := func(body string) string {
		return "rules:\n- name: ok\n  workloads: [{spiffeID: spiffe://example.org/a}]\n  trustDomains: [{name: p.example}]\n" + body
	}
	tests := []struct {
		name, doc string
		want      string
	}{
		{"not a mapping", "- a\n", `file:p:1: the policy must be a mapping, got a list`},
		{"unknown key", "rule: []\n", `file:p:1: unknown key "rule" in the policy`},
		{"unknown key case", "Rules: []\n", `(did you mean "rules"?)`},
		{"duplicate key", "rules: []\nrules: []\n", `file:p:2: duplicate key "rules" in the policy (first at line 1)`},
		{"bad default", "default: maybe\n", `file:p:1: default: trust policy default "maybe"`},
		{"default not string", "default: true\n", `file:p:1: default must be a string, got !!bool "true"`},
		{"two documents", "rules: []\n---\nrules: []\n", `file:p:2: a second YAML document`},
		{"anchor", "rules:\n- &r {name: a}\n- *r\n", `file:p:2: rules[0]: YAML anchors and aliases are not allowed`},
		{"merge key", rule("- <<: {name: x}\n"), `file:p:5: rule 2: the rule: merge keys (<<) are not supported`},
		{"rules not a list", "rules: {a: 1}\n", `file:p:1: rules must be a list, got a mapping`},
		{"rule no name", rule("- workloads: []\n"), `file:p:5: rule 2: missing required key "name"`},
		{"rule bad name", rule("- name: Pay_ments\n"), `file:p:5: rule 2: name "Pay_ments": a lowercase RFC 1123 subdomain`},
		{"rule duplicate name", rule("- name: ok\n  workloads: [{spiffeID: spiffe://example.org/b}]\n  trustDomains: [{name: p.example}]\n"), `file:p:5: rule 2 "ok": name already used by the rule at line 2`},
		{"rule unknown key", rule("- name: x\n  workload: []\n"), `file:p:6: rule 2: unknown key "workload" in the rule`},
		{"no workloads", rule("- name: x\n  trustDomains: [{name: p.example}]\n"), `file:p:5: rule 2 "x": no workloads`},
		{"no trust domains", rule("- name: x\n  workloads: [{namespace: a}]\n"), `file:p:5: rule 2 "x": no trustDomains`},
		{"empty selector", rule("- name: x\n  workloads: [{}]\n"), `file:p:6: rule 2 "x": workloads[0]: empty selector`},
		{"bad pattern", rule("- name: x\n  workloads:\n  - spiffeID: spiffe://example.org/ns/pay/\n"), `file:p:7: rule 2 "x": workloads[0].spiffeID: pattern "spiffe://example.org/ns/pay/": trailing '/'`},
		{"percent-encoded pattern", rule("- name: x\n  workloads:\n  - spiffeID: spiffe://example.org/ns/p%61y/*\n"), `file:p:7: rule 2 "x": workloads[0].spiffeID: pattern`},
		{"regex pattern", rule("- name: x\n  workloads:\n  - spiffeID: spiffe://example.org/ns/.*\n"), `workloads[0].spiffeID: pattern "spiffe://example.org/ns/.*": '*' is allowed only`},
		{"bad namespace", rule("- name: x\n  workloads: [{namespace: Pay}]\n"), `file:p:6: rule 2 "x": workloads[0].namespace "Pay"`},
		{"namespace number", rule("- name: x\n  workloads: [{namespace: 1e3}]\n"), `workloads[0].namespace must be a string, got !!float "1e3"; quote it`},
		{"empty labels", rule("- name: x\n  workloads: [{labels: {matchLabels: {}}}]\n"), `workloads[0].labels: empty label selector`},
		{"label value bool", rule("- name: x\n  workloads: [{labels: {matchLabels: {canary: true}}}]\n  trustDomains: [{name: p.example}]\n"), `workloads[0].labels.matchLabels.canary must be a string`},
		{"bad label operator", rule("- name: x\n  workloads: [{labels: {matchExpressions: [{key: a, operator: Like}]}}]\n"), `workloads[0].labels: "Like" is not a valid label selector operator`},
		{"label expression no key", rule("- name: x\n  workloads: [{labels: {matchExpressions: [{operator: Exists}]}}]\n"), `workloads[0].labels.matchExpressions[0]: missing required key "key"`},
		{"grant no name", rule("- name: x\n  workloads: [{namespace: a}]\n  trustDomains: [{peers: []}]\n"), `file:p:7: rule 2 "x": trustDomains[0]: missing required key "name"`},
		{"grant spiffe prefix", rule("- name: x\n  workloads: [{namespace: a}]\n  trustDomains: [{name: spiffe://p.example}]\n"), `trustDomains[0].name: trust domain "spiffe://p.example": want a trust domain name`},
		{"grant twice", rule("- name: x\n  workloads: [{namespace: a}]\n  trustDomains: [{name: p.example}, {name: p.example}]\n"), `file:p:5: rule 2 "x": trustDomains[1]: trust domain "p.example" is listed twice`},
		{"peer of other td", rule("- name: payments\n  workloads: [{namespace: a}]\n  trustDomains:\n  - name: p.example\n    peers:\n    - spiffe://p.example/a\n    - spiffe://q.example/a\n"), `file:p:11: rule 2 "payments": trustDomains[0].peers[1]: "spiffe://q.example/a" is not in trust domain "p.example"`},
		{"peer trailing slash", rule("- name: x\n  workloads: [{namespace: a}]\n  trustDomains: [{name: p.example, peers: [spiffe://p.example/ns/]}]\n"), `trustDomains[0].peers[0]: pattern "spiffe://p.example/ns/": trailing '/'`},
		{"peers not a list", rule("- name: x\n  workloads: [{namespace: a}]\n  trustDomains: [{name: p.example, peers: spiffe://p.example/a}]\n"), `trustDomains[0].peers must be a list, got !!str`},
		{"yaml syntax", "rules: [\n", `file:p: yaml: line 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc), "file:p")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.True(t, strings.HasPrefix(err.Error(), "trustpolicy: file:p"), err.Error())
		})
	}
}

func TestParseLimits(t *testing.T) {
	_, err := Parse(make([]byte, MaxDocumentSize+1), "file:big")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "over the 1048576 byte limit")

	var b strings.Builder
	b.WriteString("rules:\n")
	for range MaxRules + 1 {
		b.WriteString("- {}\n")
	}
	_, err = Parse([]byte(b.String()), "file:many")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "file:many:2: rules: 10001 rules, over the limit of 10000")
}

func TestParseNodeKeepsLines(t *testing.T) {
	var cfg yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte("listen: :8443\ntrustPolicy:\n  rules:\n  - name: a\n    workloads: [{namespace: x}]\n    trustDomains: [{name: p.example, peers: [bad]}]\n"), &cfg))
	tp := cfg.Content[0].Content[3]
	_, err := ParseNode(tp, "config:/etc/tb.yaml")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `trustpolicy: config:/etc/tb.yaml:6: rule 1 "a": trustDomains[0].peers[0]: pattern "bad"`)

	doc, err := ParseNode(nil, "config:x")
	require.NoError(t, err)
	assert.Empty(t, doc.Rules)
}

// FuzzParse checks that Parse never panics, and that what it accepts
// compiles for a local trust domain none of the seeds grant.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		goodPolicy, "", "rules: []", "default: allow", "- a", "rules: [{name: a}]",
		"rules:\n- name: a\n  workloads: [{labels: {matchExpressions: [{key: a, operator: Exists}]}}]\n  trustDomains: [{name: p.example}]\n",
		"rules:\n- &x {name: a}\n- *x\n", "a: 1\n---\nb: 2\n", "rules: [{name: a, workloads: [{spiffeID: 'spiffe://x/%41'}]}]",
	} {
		f.Add([]byte(s))
	}
	local := spiffeid.RequireTrustDomainFromString("local.test")
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := Parse(data, "file:fuzz")
		if err != nil {
			return
		}
		for i := range doc.Rules {
			for j := range doc.Rules[i].Workloads {
				doc.Rules[i].Workloads[j].SPIFFEID = "" // another trust domain than local
				if doc.Rules[i].Workloads[j].Namespace == "" && doc.Rules[i].Workloads[j].Labels == nil {
					doc.Rules[i].Workloads[j].Namespace = "n"
				}
			}
			doc.Rules[i].TrustDomains = slicesDeleteLocal(doc.Rules[i].TrustDomains, local)
		}
		def := doc.Default
		if def == "" {
			def = DefaultAllow
		}
		var rules []Rule
		for _, r := range doc.Rules {
			if len(r.TrustDomains) > 0 {
				rules = append(rules, r)
			}
		}
		if _, err := Compile(local, def, rules); err != nil {
			t.Fatalf("Parse accepted what Compile refuses: %v\n%s", err, data)
		}
	})
}

func slicesDeleteLocal(gs []TrustDomainGrant, local spiffeid.TrustDomain) []TrustDomainGrant {
	var out []TrustDomainGrant
	for _, g := range gs {
		if g.TrustDomain != local.Name() {
			out = append(out, g)
		}
	}
	return out
}
