package identitymap

import (
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// overlapIndex narrows the rules that may select a workload another rule
// selects. A selector's exact values (kube=true, namespace, service
// account, uid, gid, binary, binary digest, and each label it requires
// one value of) are attributes: two selectors that set one attribute to
// different values never overlap. So the rules a selector may meet are,
// for any one attribute it sets, those with a selector of the same value
// or a selector without that attribute; the index takes the smallest
// such set, and rulesMayOverlap decides.
type overlapIndex struct {
	rules    []compiledRule
	attrs    [][]map[string]string // per rule, per selector
	byValue  map[string][]int      // attribute "=" value -> rules, ascending, once each
	setByAll map[string]int        // attribute -> rules whose every selector sets it
	lacking  map[string][]int      // attribute -> rules with a selector without it, memoised
}

func newOverlapIndex(rules []compiledRule) *overlapIndex {
	x := &overlapIndex{rules: rules, attrs: make([][]map[string]string, len(rules)),
		byValue: make(map[string][]int), setByAll: make(map[string]int), lacking: make(map[string][]int)}
	for i := range rules {
		counts := make(map[string]int)
		for _, s := range rules[i].selectors {
			a := exactAttrs(s)
			x.attrs[i] = append(x.attrs[i], a)
			for k, v := range a {
				counts[k]++
				if l := x.byValue[k+"="+v]; len(l) == 0 || l[len(l)-1] != i {
					x.byValue[k+"="+v] = append(l, i)
				}
			}
		}
		for k, c := range counts {
			if c == len(rules[i].selectors) {
				x.setByAll[k]++
			}
		}
	}
	return x
}

// exactAttrs are the attributes s sets to one value.
func exactAttrs(s compiledSelector) map[string]string {
	a := map[string]string{"kube": strconv.FormatBool(s.kube())}
	for k, v := range map[string]string{"ns": s.Namespace, "sa": s.ServiceAccount, "bin": s.BinaryPath, "sha": s.BinarySHA256} {
		if v != "" {
			a[k] = v
		}
	}
	if s.UID != nil {
		a["uid"] = strconv.FormatUint(uint64(*s.UID), 10)
	}
	if s.GID != nil {
		a["gid"] = strconv.FormatUint(uint64(*s.GID), 10)
	}
	if s.PodLabels != nil {
		for k, v := range s.PodLabels.MatchLabels {
			a["label:"+k] = v
		}
		for _, e := range s.PodLabels.MatchExpressions {
			if _, dup := a["label:"+e.Key]; !dup && e.Operator == metav1.LabelSelectorOpIn && len(e.Values) == 1 {
				a["label:"+e.Key] = e.Values[0]
			}
		}
	}
	return a
}

// candidates are the rules after i that may select a workload rule i
// selects, ascending.
func (x *overlapIndex) candidates(i int) []int {
	seen := make(map[int]bool)
	for _, a := range x.attrs[i] {
		for _, j := range x.selectorCandidates(a) {
			if j > i {
				seen[j] = true
			}
		}
	}
	out := make([]int, 0, len(seen))
	for j := range seen {
		out = append(out, j)
	}
	slices.Sort(out)
	return out
}

// selectorCandidates are the rules that may meet a selector with
// attributes a, by its most selective attribute.
func (x *overlapIndex) selectorCandidates(a map[string]string) []int {
	best, bestSize := "", len(x.rules)+1
	for k, v := range a {
		if size := len(x.byValue[k+"="+v]) + len(x.rules) - x.setByAll[k]; size < bestSize || size == bestSize && k < best {
			best, bestSize = k, size
		}
	}
	return append(slices.Clone(x.byValue[best+"="+a[best]]), x.lackingAttr(best)...)
}

// lackingAttr are the rules with a selector that does not set attr.
func (x *overlapIndex) lackingAttr(attr string) []int {
	if l, ok := x.lacking[attr]; ok {
		return l
	}
	var l []int
	for j := range x.rules {
		if slices.ContainsFunc(x.attrs[j], func(a map[string]string) bool { _, ok := a[attr]; return !ok }) {
			l = append(l, j)
		}
	}
	x.lacking[attr] = l
	return l
}
