package policycrd

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// status is what r's status should be under verdict v.
func (c *Controller) status(r resource, v verdict) Status {
	want := Status{ObservedGeneration: r.obj.GetGeneration()}
	ready, reason, msg := metav1.ConditionTrue, ReasonApplied, ""
	switch {
	case v.invalid != "":
		ready, reason, msg = metav1.ConditionFalse, ReasonInvalid, v.invalid+v.lastGood()
	case v.conflict != "":
		ready, reason, msg = metav1.ConditionFalse, ReasonConflict, v.conflict
	}
	if v.rule != nil && v.conflict == "" && !v.governOnly {
		c.inForce(&want, *v.rule)
		if msg == "" {
			msg = "applied: grants " + strings.Join(want.TrustDomains, ", ")
		}
	}
	crdcontroller.SetCondition(&want.Conditions, r.cr.Status.Conditions, metav1.Condition{Type: ConditionReady, Status: ready, Reason: reason, Message: msg,
		ObservedGeneration: want.ObservedGeneration}, c.cfg.Clock.Now())
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

// capStrings keeps the first n of ss, each at most size bytes.
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

// writeStatus updates r's status when it differs from what it should be,
// so that a periodic sync with nothing new writes nothing.
func (c *Controller) writeStatus(ctx context.Context, r resource, v verdict) error {
	want := c.status(r, v)
	if reflect.DeepEqual(normalize(r.cr.Status), normalize(want)) {
		return nil
	}
	written, err := crdcontroller.UpdateStatus(ctx, c.cfg.Dynamic.Resource(GVR), r.obj, &want)
	if err != nil {
		return fmt.Errorf("status of ClusterTrustPolicy %s: %w", r.obj.GetName(), err)
	}
	if written {
		c.metrics.StatusWrites.Inc()
	}
	return nil
}

// normalize makes two statuses comparable after a round trip through the
// API server (UTC seconds, nil vs empty slices).
func normalize(s Status) Status {
	s.Conditions = slices.Clone(s.Conditions)
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = metav1.NewTime(s.Conditions[i].LastTransitionTime.UTC().Truncate(time.Second))
	}
	if len(s.Conditions) == 0 {
		s.Conditions = nil
	}
	if len(s.TrustDomains) == 0 {
		s.TrustDomains = nil
	}
	if len(s.Conflicts) == 0 {
		s.Conflicts = nil
	}
	if m := s.MatchedWorkloads; m != nil && len(m.Recent) == 0 {
		s.MatchedWorkloads = &MatchedWorkloads{Count: m.Count}
	}
	return s
}
