package trustpolicy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// linearMatches is what the index replaces: every rule, every selector.
func linearMatches(p *Policy, sub Subject) []selectorRef {
	var out []selectorRef
	for ri, r := range p.rules {
		if si := slices.IndexFunc(r.selectors, func(s compiledSelector) bool { return s.matches(sub) }); si >= 0 {
			out = append(out, selectorRef{ri, si})
		}
	}
	return out
}

func TestIndexAgreesWithLinearScan(t *testing.T) {
	rules := benchRules(300)
	rules = append(rules,
		Rule{Name: "labels", Workloads: []Selector{{Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}}}, TrustDomains: []TrustDomainGrant{{TrustDomain: "x.example"}}},
		Rule{Name: "everything", Workloads: []Selector{{Namespace: "ns7"}, {SPIFFEID: "spiffe://example.org/*"}}, TrustDomains: []TrustDomainGrant{{TrustDomain: "y.example"}}},
		Rule{Name: "ns-and-prefix", Workloads: []Selector{{SPIFFEID: "spiffe://example.org/ns/ns4/*", Namespace: "ns4"}}, TrustDomains: []TrustDomainGrant{{TrustDomain: "y.example"}}},
	)
	p, err := Compile(localTD, DefaultDeny, rules)
	require.NoError(t, err)
	var subs []Subject
	for i := range 40 {
		ns := fmt.Sprintf("ns%d", i)
		subs = append(subs,
			Subject{ID: spiffeid.RequireFromString(fmt.Sprintf("spiffe://example.org/ns/%s/sa/sa%d", ns, i))},
			Subject{ID: spiffeid.RequireFromString(fmt.Sprintf("spiffe://example.org/ns/%s/sa/sa%d", ns, i)), Namespace: ns, ServiceAccount: "x", Labels: map[string]string{"tier": "api"}},
			Subject{ID: spiffeid.RequireFromString(fmt.Sprintf("spiffe://example.org/ns/%s", ns))},
			Subject{ID: spiffeid.RequireFromString(fmt.Sprintf("spiffe://example.org/ns/%s0/sa/x", ns))},
			Subject{ID: spiffeid.RequireFromString(fmt.Sprintf("spiffe://other.example/ns/%s/sa/sa%d", ns, i)), Namespace: ns},
		)
	}
	for _, sub := range subs {
		want, got := linearMatches(p, sub), p.matches(sub)
		if len(want) == 0 {
			assert.Empty(t, got, "%+v", sub)
			continue
		}
		assert.Equal(t, want, got, "%+v", sub)
	}
}
