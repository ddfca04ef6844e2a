package identitymap

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func u32(v uint32) *uint32 { return &v }

func rule(name, id string, sels ...Selector) Rule {
	return Rule{Name: name, Origin: "test:" + name, Workloads: sels, SPIFFEID: id}
}

func compile(t *testing.T, def Default, rules ...Rule) *Map {
	t.Helper()
	m, err := Compile(Config{TrustDomain: localTD, Default: def}, rules)
	require.NoError(t, err)
	return m
}

const (
	istioTmpl = "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/sa/{{.ServiceAccount}}"
	appTmpl   = "spiffe://{{.TrustDomain}}/app/{{.PodLabels.app}}"
)

func TestSelectors(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	proc := Workload{Unix: true, UID: 1000, GID: 50, BinaryPath: "/usr/bin/exporter", BinarySHA256: sha}
	k8s := pod("pay", "api", map[string]string{"app": "web", "tier": "front"})
	serverSide := Workload{Kubernetes: true, Namespace: "pay", ServiceAccount: "api"} // a token proves no unix facts
	noLabels := Workload{Kubernetes: true, Namespace: "pay", ServiceAccount: "api", Unix: true}
	for _, tc := range []struct {
		name string
		sel  Selector
		w    Workload
		want bool
	}{
		{"every kubernetes workload", Selector{Kubernetes: true}, k8s, true},
		{"kubernetes: a process", Selector{Kubernetes: true}, proc, false},
		{"namespace", Selector{Namespace: "pay"}, k8s, true},
		{"other namespace", Selector{Namespace: "web"}, k8s, false},
		{"namespace never matches a process", Selector{Namespace: "pay"}, proc, false},
		{"namespace and service account", Selector{Namespace: "pay", ServiceAccount: "api"}, k8s, true},
		{"other service account", Selector{Namespace: "pay", ServiceAccount: "db"}, k8s, false},
		{"matchLabels", Selector{PodLabels: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}, k8s, true},
		{"matchLabels other value", Selector{PodLabels: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}, k8s, false},
		{"NotIn", Selector{PodLabels: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"db"}}}}}, k8s, true},
		{"DoesNotExist with labels unknown", Selector{PodLabels: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: metav1.LabelSelectorOpDoesNotExist}}}}, noLabels, false},
		{"labels of a process", Selector{PodLabels: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}, proc, false},
		{"uid", Selector{UID: u32(1000)}, proc, true},
		{"uid 0 is not unknown", Selector{UID: u32(0)}, serverSide, false},
		{"uid alone never selects a pod's process", Selector{UID: u32(1000)}, k8s, false},
		{"binary alone never selects a pod's process", Selector{BinaryPath: "/usr/bin/exporter"}, Workload{Kubernetes: true, Unix: true, BinaryPath: "/usr/bin/exporter"}, false},
		{"uid of a pod's process", Selector{Kubernetes: true, UID: u32(1000)}, k8s, true},
		{"other uid", Selector{UID: u32(1001)}, proc, false},
		{"gid", Selector{GID: u32(50)}, proc, true},
		{"binary path", Selector{BinaryPath: "/usr/bin/exporter"}, proc, true},
		{"other binary", Selector{BinaryPath: "/usr/bin/other"}, proc, false},
		{"binary path when not read", Selector{BinaryPath: "/usr/bin/exporter"}, Workload{Unix: true, UID: 1000}, false},
		{"sha256", Selector{BinarySHA256: sha}, proc, true},
		{"all of uid and path", Selector{UID: u32(1000), BinaryPath: "/usr/bin/exporter"}, proc, true},
		{"uid matches, path does not", Selector{UID: u32(1000), BinaryPath: "/bin/sh"}, proc, false},
		{"kubernetes and unix", Selector{Namespace: "pay", UID: u32(1000)}, k8s, true},
		{"kubernetes and unix, server side", Selector{Namespace: "pay", UID: u32(1000)}, serverSide, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, err := compileSelector(tc.sel)
			require.NoError(t, err)
			assert.Equal(t, tc.want, cs.matches(&tc.w))
		})
	}
}

func TestCompileRefuses(t *testing.T) {
	ok := rule("ok", istioTmpl, Selector{Namespace: "pay"})
	for _, tc := range []struct {
		name string
		edit func(*Rule)
		err  string
	}{
		{"no selector", func(r *Rule) { r.Workloads = nil }, "no workloads"},
		{"empty selector", func(r *Rule) { r.Workloads = []Selector{{}} }, "empty selector"},
		{"empty label selector", func(r *Rule) { r.Workloads = []Selector{{PodLabels: &metav1.LabelSelector{}}} }, "empty label selector"},
		{"bad operator", func(r *Rule) {
			r.Workloads = []Selector{{PodLabels: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Is"}}}}}
		}, "podLabels"},
		{"bad namespace", func(r *Rule) { r.Workloads = []Selector{{Namespace: "Pay"}} }, "namespace \"Pay\""},
		{"relative binary", func(r *Rule) { r.Workloads = []Selector{{BinaryPath: "bin/x"}} }, "absolute, clean"},
		{"unclean binary", func(r *Rule) { r.Workloads = []Selector{{BinaryPath: "/usr/../bin/x"}} }, "absolute, clean"},
		{"bad sha", func(r *Rule) { r.Workloads = []Selector{{BinarySHA256: "ABC"}} }, "64 lower case hex"},
		{"no name", func(r *Rule) { r.Name = "" }, "no name"},
		{"bad name", func(r *Rule) { r.Name = "Pay Rule" }, "name \"Pay Rule\""},
		{"no template", func(r *Rule) { r.SPIFFEID = "" }, "no spiffeID"},
		{"other trust domain", func(r *Rule) { r.SPIFFEID = "spiffe://other.example/x" }, "not the local"},
		{"ttl too long", func(r *Rule) { r.TTL = 25 * time.Hour }, "longer than the maximum 24h0m0s"},
		{"ttl too short", func(r *Rule) { r.TTL = time.Second }, "shorter than the minimum"},
		{"bad dns", func(r *Rule) { r.DNSNames = []string{"*.x"} }, "dnsNames[0]"},
		{"too many dns", func(r *Rule) { r.DNSNames = make([]string, MaxDNSNames+1) }, "more than 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			_, err := Compile(Config{TrustDomain: localTD}, []Rule{r})
			assert.ErrorContains(t, err, tc.err)
			assert.ErrorContains(t, err, "(test:ok)", "errors name the origin")
		})
	}
	_, err := Compile(Config{TrustDomain: localTD}, []Rule{ok, ok})
	assert.ErrorContains(t, err, "name already used by the rule at test:ok")
	_, err = Compile(Config{}, nil)
	assert.ErrorContains(t, err, "no local trust domain")
	_, err = Compile(Config{TrustDomain: localTD, Default: "allow"}, nil)
	assert.ErrorContains(t, err, `want "istio" or "none"`)
	_, err = Compile(Config{TrustDomain: localTD, MaxTTL: time.Hour}, []Rule{{Name: "a", Workloads: []Selector{{Kubernetes: true}}, SPIFFEID: istioTmpl, TTL: 2 * time.Hour}})
	assert.ErrorContains(t, err, "longer than the maximum 1h0m0s")
}

func TestDefault(t *testing.T) {
	k8s := pod("pay", "api", nil)
	proc := Workload{Unix: true, UID: 1000, BinaryPath: "/usr/bin/x"}
	for _, tc := range []struct {
		name  string
		def   Default
		rules []Rule
		w     Workload
		want  string
		err   []string
	}{
		{name: "istio form", w: k8s, want: "spiffe://example.org/ns/pay/sa/api"},
		{name: "a process gets nothing", w: proc, err: []string{"no rule is configured for uid 1000, /usr/bin/x", "rule selecting its uid or binaryPath"}},
		{name: "a pod not known", w: Workload{Kubernetes: true, PodUID: "abc"}, err: []string{"needs its namespace and service account"}},
		{name: "default none", def: DefaultNone, w: k8s, err: []string{`the default is "none"`}},
		{name: "rules do not select it: fallback", rules: []Rule{rule("web", appTmpl, Selector{Namespace: "web"})}, w: k8s, want: "spiffe://example.org/ns/pay/sa/api"},
		{name: "rules considered are named", def: DefaultNone, rules: []Rule{rule("web", appTmpl, Selector{Namespace: "web"}), rule("db", appTmpl, Selector{Namespace: "db"})}, w: k8s,
			err: []string{"none of the 2 rules (web, db) selects it", `pod pay/p-1 (service account "api")`}},
		{name: "one rule", def: DefaultNone, rules: []Rule{rule("web", appTmpl, Selector{Namespace: "web"})}, w: k8s, err: []string{"the one rule (web) does not select it"}},
		{name: "rule overrides the default", rules: []Rule{rule("pay", "spiffe://{{.TrustDomain}}/pay/{{.ServiceAccount}}", Selector{Namespace: "pay"})}, w: k8s, want: "spiffe://example.org/pay/api"},
		{name: "process by rule", rules: []Rule{rule("x", "spiffe://{{.TrustDomain}}/host/x", Selector{BinaryPath: "/usr/bin/x"})}, w: proc, want: "spiffe://example.org/host/x"},
		{name: "hostile namespace in the default", w: Workload{Kubernetes: true, Namespace: "..", ServiceAccount: "a"}, err: []string{"relative path segment"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := compile(t, tc.def, tc.rules...).Identify(tc.w)
			if tc.err != nil {
				require.Error(t, err)
				for _, e := range tc.err {
					assert.ErrorContains(t, err, e)
				}
				assert.True(t, errors.Is(err, ErrNoIdentity) || errors.Is(err, ErrFacts), err)
				assert.True(t, got.ID.IsZero())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.ID.String())
		})
	}
}

func TestIdentifyManyRules(t *testing.T) {
	var rules []Rule
	for i := range 12 {
		rules = append(rules, rule(fmt.Sprintf("r%d", i), appTmpl, Selector{Namespace: fmt.Sprintf("n%d", i)}))
	}
	_, err := compile(t, DefaultNone, rules...).Identify(pod("pay", "api", nil))
	assert.ErrorContains(t, err, "none of the 12 rules (r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 and 2 more)")
}

func TestIdentifyMerge(t *testing.T) {
	a := rule("a", istioTmpl, Selector{Namespace: "pay"})
	a.TTL, a.DNSNames = time.Hour, []string{"{{.ServiceAccount}}.{{.Namespace}}.svc", "shared.internal"}
	b := rule("b", "spiffe://example.org/ns/{{ .Namespace }}/sa/{{ .ServiceAccount }}", Selector{ServiceAccount: "api"})
	b.TTL, b.DNSNames = 10*time.Minute, []string{"shared.internal", "b.internal"}
	c := rule("c", istioTmpl, Selector{Kubernetes: true, UID: u32(1000)}) // no TTL: the issuer's
	got, err := compile(t, "", a, b, c).Identify(pod("pay", "api", nil))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/pay/sa/api", got.ID.String())
	assert.Equal(t, 10*time.Minute, got.TTL, "the smallest TTL set")
	assert.Equal(t, []string{"api.pay.svc", "b.internal", "shared.internal"}, got.DNSNames, "every rule's names, sorted, once")
	assert.Equal(t, []string{"a", "b", "c"}, got.Rules)

	got, err = compile(t, "", c).Identify(pod("pay", "api", nil))
	require.NoError(t, err)
	assert.Zero(t, got.TTL, "no rule sets one")
	assert.Empty(t, got.DNSNames)
}

func TestIdentifyConflict(t *testing.T) {
	a := rule("a", istioTmpl, Selector{Namespace: "pay"})
	b := rule("b", appTmpl, Selector{PodLabels: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}})
	m := compile(t, "", a, b)
	got, err := m.Identify(pod("pay", "api", map[string]string{"app": "web"}))
	require.ErrorIs(t, err, ErrConflict)
	assert.True(t, got.ID.IsZero(), "neither is picked")
	for _, want := range []string{`rule "a" (test:a) gives spiffe://example.org/ns/pay/sa/api`, `rule "b" (test:b) gives spiffe://example.org/app/web`} {
		assert.ErrorContains(t, err, want)
	}
	// Only one selects this one: no conflict.
	got, err = m.Identify(pod("pay", "api", map[string]string{"app": "db"}))
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, got.Rules)
}

// A rule that selects a workload but cannot fill its template fails the
// workload, even when another rule could give it an identity: dropping a
// label must not switch the identity quietly.
func TestIdentifyFactsFailClosed(t *testing.T) {
	a := rule("a", istioTmpl, Selector{Namespace: "pay"})
	b := rule("b", appTmpl, Selector{Namespace: "pay"})
	_, err := compile(t, "", a, b).Identify(pod("pay", "api", nil))
	require.ErrorIs(t, err, ErrFacts)
	assert.ErrorContains(t, err, `rule "b" (test:b) selects pod pay/p-1 (service account "api"), but its spiffeID {{.PodLabels.app}}: the pod has no label "app"`)

	c := rule("c", istioTmpl, Selector{Namespace: "pay"})
	c.DNSNames = []string{"{{.PodLabels.app}}.svc"}
	_, err = compile(t, "", c).Identify(pod("pay", "api", map[string]string{"app": "Web"}))
	require.ErrorIs(t, err, ErrFacts)
	assert.ErrorContains(t, err, "dnsNames[0] {{.PodLabels.app}}")
}

// Rules whose names merge to more than a certificate carries fail the
// workload, naming every rule that added to them; each alone is fine.
func TestIdentifyMergedDNSNamesBound(t *testing.T) {
	names := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d.{{.Namespace}}.svc", prefix, i)
		}
		return out
	}
	a := rule("a", istioTmpl, Selector{Namespace: "pay"})
	a.DNSNames = names("a", MaxDNSNames)
	b := rule("b", istioTmpl, Selector{ServiceAccount: "api"})
	b.DNSNames = names("b", 1)
	got, err := compile(t, "", a).Identify(pod("pay", "api", nil))
	require.NoError(t, err)
	assert.Len(t, got.DNSNames, MaxIdentityDNSNames, "one rule at its maximum fits")

	_, err = compile(t, "", a, b).Identify(pod("pay", "api", nil))
	require.ErrorIs(t, err, ErrFacts)
	assert.ErrorContains(t, err, fmt.Sprintf(`rules "a" (test:a), "b" (test:b) give pod pay/p-1 (service account "api") %d DNS names, more than the %d`, MaxIdentityDNSNames+1, MaxIdentityDNSNames))

	// Names the rules share count once.
	b.DNSNames = []string{"a0.{{.Namespace}}.svc"}
	got, err = compile(t, "", a, b).Identify(pod("pay", "api", nil))
	require.NoError(t, err)
	assert.Len(t, got.DNSNames, MaxIdentityDNSNames)
}
