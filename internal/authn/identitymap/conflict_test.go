package identitymap

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func labelSel(ml map[string]string, exprs ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: ml, MatchExpressions: exprs}
}

func TestConflicts(t *testing.T) {
	notIn := func(k string, v ...string) metav1.LabelSelectorRequirement {
		return metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpNotIn, Values: v}
	}
	for _, tc := range []struct {
		name     string
		a, b     Selector
		tb       string // b's template; appTmpl when ""
		conflict bool
	}{
		{name: "same selector", a: Selector{Namespace: "pay"}, b: Selector{Namespace: "pay"}, conflict: true},
		{name: "superset", a: Selector{Kubernetes: true}, b: Selector{Namespace: "pay"}, conflict: true},
		{name: "a pod's uid", a: Selector{Namespace: "pay"}, b: Selector{Kubernetes: true, UID: u32(1000)}, conflict: true},
		{name: "pods and host processes never meet", a: Selector{Namespace: "pay"}, b: Selector{UID: u32(1000)}},
		{name: "host processes", a: Selector{UID: u32(1000)}, b: Selector{BinaryPath: "/x"}, conflict: true},
		{name: "equal templates", a: Selector{Namespace: "pay"}, b: Selector{Namespace: "pay"}, tb: "spiffe://example.org/ns/{{ .Namespace }}/sa/{{.ServiceAccount}}"},
		{name: "other namespaces", a: Selector{Namespace: "pay"}, b: Selector{Namespace: "web"}},
		{name: "other service accounts", a: Selector{ServiceAccount: "a"}, b: Selector{Namespace: "pay", ServiceAccount: "b"}},
		{name: "other uids", a: Selector{UID: u32(1)}, b: Selector{UID: u32(2)}},
		{name: "other gids", a: Selector{GID: u32(1)}, b: Selector{GID: u32(2)}},
		{name: "other binaries", a: Selector{BinaryPath: "/a"}, b: Selector{BinaryPath: "/b"}},
		{name: "other label values", a: Selector{PodLabels: labelSel(map[string]string{"app": "a"})}, b: Selector{PodLabels: labelSel(map[string]string{"app": "b"})}},
		{name: "NotIn carves out", a: Selector{PodLabels: labelSel(map[string]string{"app": "a"})}, b: Selector{Kubernetes: true, PodLabels: labelSel(nil, notIn("app", "a", "b"))}},
		{name: "NotIn of another value", a: Selector{PodLabels: labelSel(map[string]string{"app": "a"})}, b: Selector{PodLabels: labelSel(nil, notIn("app", "b"))}, conflict: true},
		{name: "Exists and DoesNotExist", a: Selector{PodLabels: labelSel(nil, metav1.LabelSelectorRequirement{Key: "x", Operator: metav1.LabelSelectorOpExists})},
			b: Selector{PodLabels: labelSel(nil, metav1.LabelSelectorRequirement{Key: "x", Operator: metav1.LabelSelectorOpDoesNotExist})}},
		{name: "labels on other keys", a: Selector{PodLabels: labelSel(map[string]string{"app": "a"})}, b: Selector{PodLabels: labelSel(map[string]string{"tier": "b"})}, conflict: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := tc.tb
			if tb == "" {
				tb = appTmpl
			}
			m := compile(t, "", rule("a", istioTmpl, tc.a), rule("b", tb, tc.b))
			cs := m.Conflicts()
			if !tc.conflict {
				assert.Empty(t, cs)
				return
			}
			require.Len(t, cs, 1)
			assert.Equal(t, RuleRef{Name: "a", Origin: "test:a"}, cs[0].First)
			assert.Equal(t, RuleRef{Name: "b", Origin: "test:b"}, cs[0].Second)
			assert.Contains(t, cs[0].Message, `rule "a" (test:a) and rule "b" (test:b) may select the same workload`)
			assert.Equal(t, cs, m.ConflictsOf("b"))
		})
	}
}

// A rule with several selectors conflicts when any pair may overlap; the
// namespace index must not hide a namespace-less selector.
func TestConflictsIndex(t *testing.T) {
	var rules []Rule
	for i := range 50 {
		rules = append(rules, rule(fmt.Sprintf("ns%d", i), istioTmpl, Selector{Namespace: fmt.Sprintf("n%d", i)}))
	}
	rules = append(rules,
		rule("late", appTmpl, Selector{Namespace: "n7"}),
		rule("multi", "spiffe://{{.TrustDomain}}/m", Selector{Namespace: "zz"}, Selector{Kubernetes: true, UID: u32(3)}),
	)
	m := compile(t, "", rules...)
	var pairs []string
	for _, c := range m.Conflicts() {
		pairs = append(pairs, c.First.Name+"/"+c.Second.Name)
	}
	assert.Contains(t, pairs, "ns7/late")
	assert.Contains(t, pairs, "ns0/multi")
	assert.Contains(t, pairs, "late/multi")
	assert.Len(t, pairs, 52)
	assert.Len(t, m.ConflictsOf("late"), 2)
	assert.Empty(t, m.ConflictsOf("nope"))
	assert.Nil(t, (*Map)(nil).Conflicts())
}

func TestConflictsCapped(t *testing.T) {
	var rules []Rule
	for i := range 40 {
		rules = append(rules, rule(fmt.Sprintf("r%d", i), fmt.Sprintf("spiffe://{{.TrustDomain}}/r%d", i), Selector{Kubernetes: true}))
	}
	assert.Equal(t, 40*39/2, len(compile(t, "", rules...).Conflicts()))
	for i := 40; i < 50; i++ {
		rules = append(rules, rule(fmt.Sprintf("r%d", i), fmt.Sprintf("spiffe://{{.TrustDomain}}/r%d", i), Selector{Kubernetes: true}))
	}
	assert.Equal(t, MaxConflicts, len(compile(t, "", rules...).Conflicts()), "50*49/2 pairs, capped")
}

// The overlap index only skips pairs selectorsMayOverlap would refuse:
// on a mix of selectors it finds what trying every pair finds.
func TestConflictsIndexMatchesEveryPair(t *testing.T) {
	sels := []Selector{
		{Kubernetes: true}, {Namespace: "a"}, {Namespace: "b"}, {Namespace: "a", ServiceAccount: "x"},
		{ServiceAccount: "x"}, {PodLabels: labelSel(map[string]string{"app": "p"})}, {PodLabels: labelSel(map[string]string{"app": "q"})},
		{Namespace: "a", PodLabels: labelSel(nil, metav1.LabelSelectorRequirement{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"p"}})},
		{PodLabels: labelSel(nil, metav1.LabelSelectorRequirement{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"p"}})},
		{UID: u32(1)}, {UID: u32(2)}, {UID: u32(1), BinaryPath: "/x"}, {BinaryPath: "/x"}, {Kubernetes: true, UID: u32(1)}, {GID: u32(5)},
	}
	var rules []Rule
	for i := range 60 {
		r := rule(fmt.Sprintf("r%d", i), fmt.Sprintf("spiffe://{{.TrustDomain}}/t%d", i%7), sels[i%len(sels)])
		if i%4 == 0 {
			r.Workloads = append(r.Workloads, sels[(i*7+3)%len(sels)])
		}
		rules = append(rules, r)
	}
	m := compile(t, "", rules...)
	var want []string
	for i := range m.rules {
		for j := i + 1; j < len(m.rules); j++ {
			if m.rules[i].id.canonical() != m.rules[j].id.canonical() && rulesMayOverlap(&m.rules[i], &m.rules[j]) {
				want = append(want, m.rules[i].Name+"/"+m.rules[j].Name)
			}
		}
	}
	var got []string
	for _, c := range m.Conflicts() {
		got = append(got, c.First.Name+"/"+c.Second.Name)
	}
	require.NotEmpty(t, want)
	assert.Equal(t, want, got)
}
