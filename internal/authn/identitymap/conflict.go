package identitymap

import (
	"fmt"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// MaxConflicts caps what Conflicts reports: past that, the rules need a
// rewrite, not a longer list.
const MaxConflicts = 1000

// RuleRef names a rule and where it was written.
type RuleRef struct {
	Name   string `json:"name"`
	Origin string `json:"origin"`
}

// Conflict is two rules that may select the same workload and have
// different SPIFFE ID templates: such a workload gets no identity
// (Identify fails with ErrConflict). It is found when the rules are
// compiled, so the status, the audit findings and `policy explain` show
// it before a workload fails.
type Conflict struct {
	First  RuleRef `json:"first"`
	Second RuleRef `json:"second"`
	// Templates are the two rules' SPIFFE ID templates, canonical.
	Templates [2]string `json:"templates"`
	Message   string    `json:"message"`
}

// conflictSet is a Map's conflicts, found on first use and kept: the map
// is immutable, and every status page and explain asks.
type conflictSet struct {
	once   sync.Once
	list   []Conflict
	byRule map[string][]int // indexes into list, by either rule's name
}

// Conflicts lists the pairs of rules with different SPIFFE ID templates
// that may select one workload (at most MaxConflicts), in rule order.
// Selectors are told apart only where that is certain (host processes
// and pods, different namespaces, service accounts, uids, gids, binaries,
// or label requirements no label value satisfies both); the rest are
// assumed to overlap. Two templates that differ in text are reported even where the
// facts could make them equal.
func (m *Map) Conflicts() []Conflict {
	if m == nil {
		return nil
	}
	return slices.Clone(m.conflictSet().list)
}

// ConflictsOf is the part of Conflicts that names rule, in the same
// order: one IdentityMapping resource's status.
func (m *Map) ConflictsOf(rule string) []Conflict {
	if m == nil {
		return nil
	}
	cs := m.conflictSet()
	out := make([]Conflict, 0, len(cs.byRule[rule]))
	for _, i := range cs.byRule[rule] {
		out = append(out, cs.list[i])
	}
	return out
}

func (m *Map) conflictSet() *conflictSet {
	cs := &m.conflicts
	cs.once.Do(func() {
		cs.list = m.findConflicts()
		cs.byRule = make(map[string][]int)
		for i, c := range cs.list {
			cs.byRule[c.First.Name] = append(cs.byRule[c.First.Name], i)
			cs.byRule[c.Second.Name] = append(cs.byRule[c.Second.Name], i)
		}
	})
	return cs
}

// findConflicts tries each rule against the later rules an overlapIndex
// says may share its exact values: a map of one rule per app label or
// namespace costs O(rules), where trying every pair cost O(rules²) (13 s
// at 10,000 rules).
func (m *Map) findConflicts() []Conflict {
	canon := make([]string, len(m.rules))
	for i := range m.rules {
		canon[i] = m.rules[i].id.canonical()
	}
	idx := newOverlapIndex(m.rules)
	var out []Conflict
	for i := range m.rules {
		for _, j := range idx.candidates(i) {
			if canon[i] == canon[j] || !rulesMayOverlap(&m.rules[i], &m.rules[j]) {
				continue
			}
			out = append(out, newConflict(&m.rules[i], &m.rules[j], canon[i], canon[j]))
			if len(out) == MaxConflicts {
				return out
			}
		}
	}
	return out
}

func newConflict(a, b *compiledRule, ta, tb string) Conflict {
	return Conflict{
		First:     RuleRef{Name: a.Name, Origin: a.Origin},
		Second:    RuleRef{Name: b.Name, Origin: b.Origin},
		Templates: [2]string{ta, tb},
		Message: fmt.Sprintf("rule %q (%s) and rule %q (%s) may select the same workload and make different SPIFFE IDs (%s, %s): "+
			"such a workload gets no identity; make the selectors disjoint (another namespace, a podLabels NotIn) or the templates equal",
			a.Name, a.Origin, b.Name, b.Origin, ta, tb),
	}
}

func rulesMayOverlap(a, b *compiledRule) bool {
	for _, sa := range a.selectors {
		for _, sb := range b.selectors {
			if selectorsMayOverlap(sa, sb) {
				return true
			}
		}
	}
	return false
}

// selectorsMayOverlap is false only when no workload can match both.
// A selector of unix fields only matches host processes, so it never
// meets one with a Kubernetes field.
func selectorsMayOverlap(a, b compiledSelector) bool {
	differ := func(x, y string) bool { return x != "" && y != "" && x != y }
	differID := func(x, y *uint32) bool { return x != nil && y != nil && *x != *y }
	switch {
	case a.kube() != b.kube():
		return false
	case differ(a.Namespace, b.Namespace), differ(a.ServiceAccount, b.ServiceAccount):
		return false
	case differ(a.BinaryPath, b.BinaryPath), differ(a.BinarySHA256, b.BinarySHA256):
		return false
	case differID(a.UID, b.UID), differID(a.GID, b.GID):
		return false
	}
	return a.labels == nil || b.labels == nil || !labelsDisjoint(a.labels, b.labels)
}

// labelsDisjoint reports whether some requirement of a and one of b on
// the same key cannot both hold.
func labelsDisjoint(a, b labels.Selector) bool {
	ra, _ := a.Requirements()
	rb, _ := b.Requirements()
	for i := range ra {
		for j := range rb {
			if ra[i].Key() == rb[j].Key() && (requirementsDisjoint(&ra[i], &rb[j]) || requirementsDisjoint(&rb[j], &ra[i])) {
				return true
			}
		}
	}
	return false
}

// requirementsDisjoint is one direction of the check: x's kind first.
func requirementsDisjoint(x, y *labels.Requirement) bool {
	in := func(r *labels.Requirement) bool {
		op := r.Operator()
		return op == selection.In || op == selection.Equals || op == selection.DoubleEquals
	}
	notIn := func(r *labels.Requirement) bool {
		return r.Operator() == selection.NotIn || r.Operator() == selection.NotEquals
	}
	switch {
	case in(x) && in(y):
		return !x.Values().HasAny(y.ValuesUnsorted()...)
	case in(x) && notIn(y):
		return y.Values().IsSuperset(x.Values())
	case (in(x) || x.Operator() == selection.Exists) && y.Operator() == selection.DoesNotExist:
		return true
	}
	return false
}
