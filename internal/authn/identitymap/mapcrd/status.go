package mapcrd

import (
	"fmt"
	"slices"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
)

// status is what r's status should be under v, with the combined map in
// force (Config.Current) as it is now.
func (c *Controller) status(r resource, v verdict) Status {
	want := Status{ObservedGeneration: r.Obj.GetGeneration()}
	msg := ""
	if rule := v.InForce(); rule != nil {
		msg = inForce(&want, *rule, c.current())
	}
	want.Conditions = c.rules.Ready(r, v, r.CR.Status.Conditions, msg)
	return want
}

// current is the combined map in force, nil when not known.
func (c *Controller) current() *identitymap.Map {
	if c.cfg.Current == nil {
		return nil
	}
	return c.cfg.Current()
}

// inForce fills in the rule in force's template, whether the server can
// check it and its conflicts, and says so in a sentence.
func inForce(s *Status, rule identitymap.Rule, current *identitymap.Map) string {
	s.SPIFFEID = rule.SPIFFEID
	msg := "accepted: gives " + rule.SPIFFEID
	if current == nil {
		return msg
	}
	checks := !slices.ContainsFunc(current.AgentOnly(), func(a identitymap.AgentOnlyRule) bool { return a.Name == rule.Name })
	s.ServerChecks = &checks
	if !checks {
		msg += "; only node agents can evaluate it, so the server never grants its IDs to them"
	}
	for _, cf := range current.ConflictsOf(rule.Name) {
		if len(s.Conflicts) == MaxConflicts {
			break
		}
		s.Conflicts = append(s.Conflicts, crdcontroller.Truncate(cf.Message, 1000))
	}
	if n := len(s.Conflicts); n > 0 {
		msg += fmt.Sprintf("; in conflict with %d other rules: a workload both select gets no identity (status.conflicts)", n)
	}
	return msg
}
