package policycrd

import (
	"slices"
	"strings"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// status is what r's status should be under v.
func (c *Controller) status(r resource, v verdict) Status {
	want := Status{ObservedGeneration: r.Obj.GetGeneration()}
	msg := ""
	if rule := v.InForce(); rule != nil {
		c.inForce(&want, *rule)
		msg = "applied: grants " + strings.Join(want.TrustDomains, ", ")
	}
	want.Conditions = c.rules.Ready(r, v, r.CR.Status.Conditions, msg)
	return want
}

// inForce fills in what the rule in force grants and matched.
func (c *Controller) inForce(s *Status, rule trustpolicy.Rule) {
	for _, g := range rule.TrustDomains {
		s.TrustDomains = append(s.TrustDomains, g.TrustDomain)
	}
	if c.cfg.Matched != nil {
		n, recent := c.cfg.Matched(rule.Name)
		s.MatchedWorkloads = &MatchedWorkloads{Count: int64(n), Recent: capStrings(recent, MaxRecent, 2048)}
	}
	if c.cfg.Conflicts != nil {
		s.Conflicts = capStrings(c.cfg.Conflicts(rule.Name), MaxConflicts, 1000)
	}
}

// capStrings keeps the first n of ss, each at most size bytes; none is
// nil, as a stored status decodes it (crdcontroller.RuleSetConfig.Status).
func capStrings(ss []string, n, size int) []string {
	if len(ss) == 0 {
		return nil
	}
	out := slices.Clone(ss[:min(n, len(ss))])
	for i := range out {
		out[i] = crdcontroller.Truncate(out[i], size)
	}
	return out
}
