package trustpolicy

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// benchRules is n rules, a third each selecting by exact SPIFFE ID, by
// path prefix and by namespace, granting one of ten trust domains (every
// fourth with peers).
func benchRules(n int) []Rule {
	rules := make([]Rule, n)
	for i := range n {
		var sel Selector
		switch i % 3 {
		case 0:
			sel.SPIFFEID = fmt.Sprintf("spiffe://example.org/ns/ns%d/sa/sa%d", i, i)
		case 1:
			sel.SPIFFEID = fmt.Sprintf("spiffe://example.org/ns/ns%d/*", i)
		default:
			sel.Namespace = fmt.Sprintf("ns%d", i)
		}
		td := fmt.Sprintf("td%d.example", i%10)
		g := TrustDomainGrant{TrustDomain: td}
		if i%4 == 0 {
			g.Peers = []string{fmt.Sprintf("spiffe://%s/ns/p%d/*", td, i)}
		}
		rules[i] = Rule{Name: fmt.Sprintf("r%d", i), Origin: "bench", Workloads: []Selector{sel}, TrustDomains: []TrustDomainGrant{g}}
	}
	return rules
}

// BenchmarkDecide is one SDS stream's decision with a policy of 1,000
// rules against one rule. The callers are 64 service accounts, the n-th
// in namespace ns<n>, so each is selected by about one rule of each kind.
func BenchmarkDecide(b *testing.B) {
	idents := make([]authn.Identity, 64)
	for i := range idents {
		idents[i] = saIdentity(fmt.Sprintf("ns%d", i*15), fmt.Sprintf("sa%d", i*15))
	}
	for _, n := range []int{1, 1000} {
		name := fmt.Sprintf("rules-%d", n)
		if n == 1 {
			name = "baseline-1-rule"
		}
		b.Run(name, func(b *testing.B) {
			p, err := Compile(localTD, DefaultAllow, benchRules(n))
			require.NoError(b, err)
			a := NewAccess(NewCell(p), nil)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				a.Decide(idents[i%len(idents)])
				i++
			}
		})
	}
}

// peerLimitedRules is n rules, each selecting its own namespace and
// granting one trust domain with peers, and every tenth also granting a
// second without: the reviewer's shape, where conflicts are few but every
// restricted grant used to be checked against every rule.
func peerLimitedRules(n int) []Rule {
	rules := make([]Rule, n)
	for i := range n {
		rules[i] = Rule{Name: fmt.Sprintf("r%d", i), Origin: "bench", Workloads: []Selector{{Namespace: fmt.Sprintf("ns%d", i)}},
			TrustDomains: []TrustDomainGrant{{TrustDomain: "partner.example", Peers: []string{fmt.Sprintf("spiffe://partner.example/ns/p%d/*", i)}}}}
		if i%10 == 0 {
			rules[i].TrustDomains = append(rules[i].TrustDomains, TrustDomainGrant{TrustDomain: "other.example"})
		}
	}
	return rules
}

// BenchmarkConflicts is what the first Conflicts call of a new policy
// costs (later calls reuse it), against a one-rule baseline.
func BenchmarkConflicts(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		name := fmt.Sprintf("peer-limited-%d", n)
		if n == 1 {
			name = "baseline-1-rule"
		}
		b.Run(name, func(b *testing.B) {
			rules := peerLimitedRules(n)
			for b.Loop() {
				b.StopTimer()
				p, err := Compile(localTD, DefaultAllow, rules)
				require.NoError(b, err)
				b.StartTimer()
				p.Conflicts()
			}
		})
	}
}
