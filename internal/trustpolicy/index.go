package trustpolicy

import (
	"cmp"
	"slices"
)

// selectorRef is selector sel of rule rule.
type selectorRef struct{ rule, sel int }

// ruleIndex finds the selectors that may match a subject without trying
// every rule: each selector sits in one bucket, by exact SPIFFE ID, by
// path prefix, by namespace, or (label-only selectors) in scan. With
// 1,000 rules a decision tries a handful of selectors, not 1,000.
// Candidates are then checked in full by compiledSelector.matches.
type ruleIndex struct {
	exact     map[string][]selectorRef // by SPIFFE ID
	prefix    map[string][]selectorRef // by path prefix; "" is the whole trust domain
	namespace map[string][]selectorRef
	scan      []selectorRef
}

func newRuleIndex(rules []compiledRule) ruleIndex {
	x := ruleIndex{exact: make(map[string][]selectorRef), prefix: make(map[string][]selectorRef), namespace: make(map[string][]selectorRef)}
	for ri, r := range rules {
		for si, s := range r.selectors {
			ref := selectorRef{ri, si}
			switch {
			case s.id != nil && !s.id.IsPrefix():
				k := s.id.exact.String()
				x.exact[k] = append(x.exact[k], ref)
			case s.id != nil:
				x.prefix[s.id.prefix] = append(x.prefix[s.id.prefix], ref)
			case s.namespace != "":
				x.namespace[s.namespace] = append(x.namespace[s.namespace], ref)
			default:
				x.scan = append(x.scan, ref)
			}
		}
	}
	return x
}

// matches returns, in rule order, each rule that selects sub with the
// first of its selectors that does. A prefix pattern matches a path only
// below one of the path's "/"-delimited proper prefixes, which the loop
// enumerates.
func (p *Policy) matches(sub Subject) []selectorRef {
	var cands []selectorRef
	if sub.ID.MemberOf(p.local) {
		cands = append(cands, p.index.exact[sub.ID.String()]...)
		path := sub.ID.Path()
		for i := 0; i < len(path); i++ {
			if path[i] == '/' {
				cands = append(cands, p.index.prefix[path[:i]]...)
			}
		}
	}
	if sub.Namespace != "" {
		cands = append(cands, p.index.namespace[sub.Namespace]...)
	}
	cands = append(cands, p.index.scan...)
	out := cands[:0]
	for _, c := range cands {
		if p.rules[c.rule].selectors[c.sel].matches(sub) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b selectorRef) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.sel, b.sel))
	})
	return slices.CompactFunc(out, func(a, b selectorRef) bool { return a.rule == b.rule })
}
