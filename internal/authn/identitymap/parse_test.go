package identitymap

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseExample(t *testing.T) {
	data, err := os.ReadFile("testdata/identities.yaml")
	require.NoError(t, err)
	doc, err := Parse(data, "file:ids.yaml")
	require.NoError(t, err)
	assert.Equal(t, DefaultIstio, doc.Default)
	require.Len(t, doc.Rules, 3)
	assert.Equal(t, Rule{
		Name: "payments-api", Origin: "file:ids.yaml:4",
		Workloads: []Selector{{Namespace: "payments", ServiceAccount: "api", PodLabels: &metav1.LabelSelector{
			MatchLabels:      map[string]string{"app": "api"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "track", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"canary"}}},
		}}},
		SPIFFEID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}",
		TTL:      time.Hour,
		DNSNames: []string{"{{.PodLabels.app}}.{{.Namespace}}.svc"},
	}, doc.Rules[0])
	assert.Equal(t, u32(65534), doc.Rules[1].Workloads[0].UID)
	assert.True(t, doc.Rules[2].Workloads[0].Kubernetes)

	m, err := Compile(Config{TrustDomain: localTD, Default: doc.Default}, doc.Rules)
	require.NoError(t, err)
	assert.Empty(t, m.Conflicts())
	id, err := m.Identify(Workload{Unix: true, UID: 65534, BinaryPath: "/usr/bin/node_exporter"})
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/node/exporter", id.ID.String())
	id, err = m.Identify(pod("payments", "api", map[string]string{"app": "api"}))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/payments/app/api", id.ID.String())
	assert.Equal(t, []string{"api.payments.svc"}, id.DNSNames)
}

func TestParseEmpty(t *testing.T) {
	for _, s := range []string{"", "# nothing\n", "~", "rules: []", "rules:"} {
		doc, err := Parse([]byte(s), "file:x")
		require.NoError(t, err, s)
		assert.Empty(t, doc.Rules)
		assert.Empty(t, doc.Default)
	}
}

func TestParseErrors(t *testing.T) {
	const ok = "rules:\n- name: a\n  workloads: [{namespace: pay}]\n  spiffeID: spiffe://{{.TrustDomain}}/x\n"
	for _, tc := range []struct{ name, doc, err string }{
		{"unknown top key", "rule: []", `file:x:1: unknown key "rule" in the identity map (known: default, rules)`},
		{"did you mean", "rules:\n- name: a\n  spiffeId: x", `did you mean "spiffeID"?`},
		{"unknown selector key", "rules:\n- name: a\n  workloads: [{ns: pay}]\n  spiffeID: spiffe://{{.TrustDomain}}/x", `file:x:3: rule 1 "a": unknown key "ns" in workloads[0]`},
		{"unknown label key", strings.Replace(ok, "{namespace: pay}", "{podLabels: {matchLabel: {a: b}}}", 1), `unknown key "matchLabel" in workloads[0].podLabels`},
		{"unknown expression key", strings.Replace(ok, "{namespace: pay}", "{podLabels: {matchExpressions: [{key: a, op: In}]}}", 1), `unknown key "op" in workloads[0].podLabels.matchExpressions[0]`},
		{"duplicate key", ok + "  name: b\n", `duplicate key "name" in the rule (first at line 2)`},
		{"second document", ok + "---\nrules: []\n", "a second YAML document"},
		{"anchor", "rules:\n- &r {name: a}\n", "anchors and aliases are not allowed"},
		{"merge key", "rules:\n- <<: {name: a}\n", "merge keys"},
		{"bad default", "default: allow", `file:x:1: default: identity map default "allow"`},
		{"missing name", "rules:\n- workloads: [{namespace: a}]\n  spiffeID: x", `missing required key "name"`},
		{"missing workloads", "rules:\n- name: a\n  spiffeID: x", `missing required key "workloads"`},
		{"missing spiffeID", "rules:\n- name: a\n  workloads: [{namespace: a}]", `missing required key "spiffeID"`},
		{"empty workloads", strings.Replace(ok, "[{namespace: pay}]", "[]", 1), "workloads: empty"},
		{"empty selector", strings.Replace(ok, "{namespace: pay}", "{}", 1), "file:x:3: rule 1 \"a\": workloads[0]: empty selector"},
		{"kubernetes false", strings.Replace(ok, "{namespace: pay}", "{kubernetes: false}", 1), "workloads[0].kubernetes must be true"},
		{"kubernetes string", strings.Replace(ok, "{namespace: pay}", "{kubernetes: 'true'}", 1), "workloads[0].kubernetes must be true"},
		{"uid string", strings.Replace(ok, "{namespace: pay}", "{uid: '0'}", 1), "workloads[0].uid must be a decimal integer"},
		{"uid negative", strings.Replace(ok, "{namespace: pay}", "{uid: -1}", 1), "workloads[0].uid must be a decimal integer"},
		{"uid too big", strings.Replace(ok, "{namespace: pay}", "{uid: 4294967296}", 1), "workloads[0].uid must be a decimal integer"},
		{"uid hex", strings.Replace(ok, "{namespace: pay}", "{uid: 0x10}", 1), "workloads[0].uid must be a decimal integer"},
		{"gid float", strings.Replace(ok, "{namespace: pay}", "{gid: 1.0}", 1), "workloads[0].gid must be a decimal integer"},
		{"namespace number", strings.Replace(ok, "{namespace: pay}", "{namespace: 1e3}", 1), "workloads[0].namespace must be a string"},
		{"bad namespace", strings.Replace(ok, "{namespace: pay}", "{namespace: Pay}", 1), `namespace "Pay"`},
		{"empty label selector", strings.Replace(ok, "{namespace: pay}", "{podLabels: {}}", 1), "empty label selector"},
		{"bad operator", strings.Replace(ok, "{namespace: pay}", "{podLabels: {matchExpressions: [{key: a, operator: Is}]}}", 1), "podLabels"},
		{"bad name", strings.Replace(ok, "name: a", "name: A_b", 1), `file:x:2: rule 1: name "A_b"`},
		{"duplicate name", ok + strings.TrimPrefix(ok, "rules:\n"), `rule 2 "a": name already used by the rule at line 2`},
		{"bad template", strings.Replace(ok, "/x", "/{{.Namespace | upper}}", 1), `file:x:4: rule 1 "a": spiffeID: column`},
		{"template injection", strings.Replace(ok, "/x", "/../x", 1), "non-root SPIFFE ID path"},
		{"bad ttl", ok + "  ttl: forever\n", `ttl "forever": want a positive Go duration`},
		{"ttl number", ok + "  ttl: 3600\n", "ttl must be a string"},
		{"ttl too short", ok + "  ttl: 1s\n", "shorter than the minimum"},
		{"dns wildcard", ok + "  dnsNames: ['*.svc']\n", `file:x:5: rule 1 "a": dnsNames[0]: template`},
		{"dns not a list", ok + "  dnsNames: a.svc\n", "dnsNames must be a list"},
		{"too big", strings.Repeat("#", MaxDocumentSize+1), "over the 1048576 byte limit"},
		{"not yaml", "rules: [", "file:x: yaml"},
		{"top level list", "- a", "the identity map must be a mapping, got a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), "file:x")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
			assert.True(t, strings.HasPrefix(err.Error(), "identitymap: "), err.Error())
		})
	}
}

func TestParseLeavesLocalChecksToCompile(t *testing.T) {
	doc, err := Parse([]byte("rules:\n- name: a\n  workloads: [{namespace: pay}]\n  spiffeID: spiffe://other.example/x\n  ttl: 48h\n"), "file:x")
	require.NoError(t, err)
	_, err = Compile(Config{TrustDomain: localTD}, doc.Rules)
	assert.ErrorContains(t, err, `rule 1 "a" (file:x:2): spiffeID: template names trust domain "other.example"`)
	doc.Rules[0].SPIFFEID = "spiffe://example.org/x"
	_, err = Compile(Config{TrustDomain: localTD}, doc.Rules)
	assert.ErrorContains(t, err, "ttl 48h0m0s: longer than the maximum 24h0m0s")
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile("testdata/identities.yaml")
	require.NoError(f, err)
	for _, s := range []string{
		string(data), "", "rules: []", "default: none", "- a", "rules: [{name: a}]",
		"rules:\n- name: a\n  workloads: [{uid: 0, gid: 4294967295}]\n  spiffeID: spiffe://{{.TrustDomain}}/u/{{.UID}}\n",
		"rules:\n- name: a\n  workloads: [{podLabels: {matchExpressions: [{key: a, operator: Exists}]}}]\n  spiffeID: spiffe://x/{{.PodLabels.a}}\n  dnsNames: ['{{.PodLabels.a}}.x']\n",
		"rules:\n- &x {name: a}\n- *x\n", "a: 1\n---\nb: 2\n", "rules: [{name: a, workloads: [{kubernetes: true}], spiffeID: 'spiffe://x/%41'}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := Parse(data, "file:fuzz")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "identitymap: ") {
				t.Fatalf("error without the package prefix: %v", err)
			}
			return
		}
		// What Parse accepts compiles, but for the local trust domain and
		// the maximum TTL, which Parse does not know.
		for i := range doc.Rules {
			doc.Rules[i].SPIFFEID = strings.Replace(doc.Rules[i].SPIFFEID, "spiffe://"+literalTDOf(doc.Rules[i].SPIFFEID)+"/", "spiffe://{{.TrustDomain}}/", 1)
		}
		m, err := Compile(Config{TrustDomain: localTD, Default: doc.Default, MaxTTL: 1 << 62}, doc.Rules)
		if err != nil {
			t.Fatalf("Parse accepted what Compile refuses: %v", err)
		}
		_ = m.Conflicts()
		e := m.Explain(pod("pay", "api", map[string]string{"app": "web"}))
		if e.SPIFFEID != "" && !strings.HasPrefix(e.SPIFFEID, "spiffe://example.org/") {
			t.Fatalf("identity %q outside the trust domain", e.SPIFFEID)
		}
	})
}

// literalTDOf is the trust domain an ID template spells out, "" if none.
func literalTDOf(tmpl string) string {
	t, err := parseIDTemplate(tmpl)
	if err != nil {
		return ""
	}
	return t.literalTD
}
