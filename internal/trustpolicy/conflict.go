package trustpolicy

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// MaxConflicts caps what Conflicts reports: past that, the policy needs a
// rewrite, not a longer list.
const MaxConflicts = 1000

// RuleRef names a rule and where it was written.
type RuleRef struct {
	Name   string `json:"name"`
	Origin string `json:"origin"`
}

// Conflict is a peer restriction another rule lifts: Restricting grants
// TrustDomain only with some peers, Lifting grants it without peers, and
// some workloads may be selected by both, which then accept every member
// of the trust domain. Rules only add, so this is what the policy says;
// it is reported because it is rarely what its authors meant.
type Conflict struct {
	TrustDomain string  `json:"trustDomain"`
	Restricting RuleRef `json:"restricting"`
	Lifting     RuleRef `json:"lifting"`
	Message     string  `json:"message"`
}

// conflictSet is a Policy's conflicts, found on first use and kept: the
// policy is immutable, and they are asked for often (every /v1/snapshot,
// /ui and explain request, which need no token, and every
// ClusterTrustPolicy status update, once per resource).
type conflictSet struct {
	once   sync.Once
	list   []Conflict
	byRule map[string][]int // indexes into list, by either rule's name
}

// Conflicts lists the peer restrictions other rules lift for workloads
// both may select (at most MaxConflicts). Selectors are told apart only
// where that is certain (different namespaces, SPIFFE ID patterns that
// share no ID); label selectors are assumed to overlap.
func (p *Policy) Conflicts() []Conflict {
	if p == nil {
		return nil
	}
	return slices.Clone(p.conflictSet().list)
}

// ConflictsOf is the part of Conflicts where rule restricts or lifts,
// in the same order: a ClusterTrustPolicy's status. Conflicts past
// MaxConflicts are in neither.
func (p *Policy) ConflictsOf(rule string) []Conflict {
	if p == nil {
		return nil
	}
	cs := p.conflictSet()
	idx := cs.byRule[rule]
	if len(idx) == 0 {
		return nil
	}
	out := make([]Conflict, len(idx))
	for k, i := range idx {
		out[k] = cs.list[i]
	}
	return out
}

func (p *Policy) conflictSet() *conflictSet {
	cs := &p.conflicts
	cs.once.Do(func() {
		cs.list = p.findConflicts()
		cs.byRule = make(map[string][]int)
		for i, c := range cs.list {
			cs.byRule[c.Restricting.Name] = append(cs.byRule[c.Restricting.Name], i)
			if c.Lifting.Name != c.Restricting.Name {
				cs.byRule[c.Lifting.Name] = append(cs.byRule[c.Lifting.Name], i)
			}
		}
	})
	return cs
}

// findConflicts pairs every restricted grant with the rules that grant
// the same trust domain without peers. Only those can lift it, so they
// are indexed by trust domain first: a policy of peer-limited rules costs
// O(rules), where trying every pair of rules cost O(rules²) (0.77 s at
// 10,000 rules).
func (p *Policy) findConflicts() []Conflict {
	lifters := make(map[spiffeid.TrustDomain][]int)
	for j := range p.rules {
		for _, g := range p.rules[j].grants {
			if len(g.Peers) == 0 {
				lifters[g.TrustDomain] = append(lifters[g.TrustDomain], j)
			}
		}
	}
	var out []Conflict
	for i := range p.rules {
		r := &p.rules[i]
		for _, g := range r.grants {
			if len(g.Peers) == 0 {
				continue
			}
			for _, j := range lifters[g.TrustDomain] {
				if j == i || !rulesMayOverlap(r, &p.rules[j]) {
					continue
				}
				out = append(out, newConflict(r, &p.rules[j], g))
				if len(out) >= MaxConflicts {
					return out
				}
			}
		}
	}
	return out
}

// newConflict is restricted grant g of r lifted by u.
func newConflict(r, u *compiledRule, g Grant) Conflict {
	peers := make([]string, len(g.Peers))
	for k, pt := range g.Peers {
		peers[k] = pt.String()
	}
	td := g.TrustDomain.Name()
	return Conflict{
		TrustDomain: td,
		Restricting: RuleRef{Name: r.Name, Origin: r.Origin},
		Lifting:     RuleRef{Name: u.Name, Origin: u.Origin},
		Message: fmt.Sprintf("rule %q (%s) limits %s to peers %s, but rule %q (%s) grants %s without peers: workloads both select accept every member of %s",
			r.Name, r.Origin, td, strings.Join(peers, ", "), u.Name, u.Origin, td, td),
	}
}

func rulesMayOverlap(a, b *compiledRule) bool {
	for _, x := range a.selectors {
		for _, y := range b.selectors {
			if selectorsMayOverlap(x, y) {
				return true
			}
		}
	}
	return false
}

// selectorsMayOverlap is false only when no subject can match both.
func selectorsMayOverlap(a, b compiledSelector) bool {
	if a.namespace != "" && b.namespace != "" && a.namespace != b.namespace {
		return false
	}
	if a.id != nil && b.id != nil && !patternsMayOverlap(*a.id, *b.id) {
		return false
	}
	return true
}

func patternsMayOverlap(a, b Pattern) bool {
	switch {
	case a.td != b.td:
		return false
	case !a.IsPrefix() && !b.IsPrefix():
		return a.exact == b.exact
	case !a.IsPrefix():
		return b.Matches(a.exact)
	case !b.IsPrefix():
		return a.Matches(b.exact)
	}
	// Two prefixes share IDs when one path lies below the other.
	return strings.HasPrefix(a.prefix+"/", b.prefix+"/") || strings.HasPrefix(b.prefix+"/", a.prefix+"/")
}
