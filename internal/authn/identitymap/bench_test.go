package identitymap

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// labelRules is n rules of the common shape: one app label each, every
// rule its own ID, no two selecting the same pod.
func labelRules(n int) []Rule {
	rules := make([]Rule, n)
	for i := range rules {
		rules[i] = rule(fmt.Sprintf("r%d", i), fmt.Sprintf("spiffe://{{.TrustDomain}}/app/a%d", i),
			Selector{PodLabels: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", i)}}})
	}
	return rules
}

func BenchmarkConflicts(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		rules := labelRules(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				m, _ := Compile(Config{TrustDomain: localTD}, rules)
				if len(m.Conflicts()) != 0 {
					b.Fatal("conflicts")
				}
			}
		})
	}
}

func BenchmarkIdentify(b *testing.B) {
	m, err := Compile(Config{TrustDomain: localTD}, labelRules(1000))
	if err != nil {
		b.Fatal(err)
	}
	w := pod("pay", "api", map[string]string{"app": "a500"})
	for b.Loop() {
		if _, err := m.Identify(w); err != nil {
			b.Fatal(err)
		}
	}
}
