package trustpolicy

import (
	"fmt"
	"strings"
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

// Conflicts lists the peer restrictions other rules lift for workloads
// both may select (at most MaxConflicts). Selectors are told apart only
// where that is certain (different namespaces, SPIFFE ID patterns that
// share no ID); label selectors are assumed to overlap.
func (p *Policy) Conflicts() []Conflict {
	if p == nil {
		return nil
	}
	var out []Conflict
	for i := range p.rules {
		for _, g := range p.rules[i].grants {
			if len(g.Peers) == 0 {
				continue
			}
			out = p.liftersOf(&p.rules[i], g, out)
			if len(out) >= MaxConflicts {
				return out[:MaxConflicts]
			}
		}
	}
	return out
}

// liftersOf appends the conflicts of the restricted grant g of rule r.
func (p *Policy) liftersOf(r *compiledRule, g Grant, out []Conflict) []Conflict {
	for j := range p.rules {
		u := &p.rules[j]
		if u == r || !grantsUnrestricted(u, g) || !rulesMayOverlap(r, u) {
			continue
		}
		peers := make([]string, len(g.Peers))
		for k, pt := range g.Peers {
			peers[k] = pt.String()
		}
		td := g.TrustDomain.Name()
		out = append(out, Conflict{
			TrustDomain: td,
			Restricting: RuleRef{Name: r.Name, Origin: r.Origin},
			Lifting:     RuleRef{Name: u.Name, Origin: u.Origin},
			Message: fmt.Sprintf("rule %q (%s) limits %s to peers %s, but rule %q (%s) grants %s without peers: workloads both select accept every member of %s",
				r.Name, r.Origin, td, strings.Join(peers, ", "), u.Name, u.Origin, td, td),
		})
		if len(out) >= MaxConflicts {
			return out
		}
	}
	return out
}

func grantsUnrestricted(r *compiledRule, g Grant) bool {
	for _, o := range r.grants {
		if o.TrustDomain == g.TrustDomain && len(o.Peers) == 0 {
			return true
		}
	}
	return false
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
