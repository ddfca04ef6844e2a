package mapcrd

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
)

// status is what r's status should be under verdict v, with current the
// combined map in force (nil: not known).
func (c *Controller) status(r resource, v verdict, current *identitymap.Map) Status {
	want := Status{ObservedGeneration: r.obj.GetGeneration()}
	ready, reason, msg := metav1.ConditionTrue, ReasonAccepted, ""
	switch {
	case v.invalid != "":
		ready, reason, msg = metav1.ConditionFalse, ReasonInvalid, v.invalid+v.lastGood()
	case v.refused != "":
		ready, reason, msg = metav1.ConditionFalse, ReasonRefused, v.refused
	}
	if v.rule != nil && v.refused == "" {
		inForce := inForce(&want, *v.rule, current)
		if msg == "" {
			msg = inForce
		}
	}
	crdcontroller.SetCondition(&want.Conditions, r.cr.Status.Conditions, metav1.Condition{Type: ConditionReady, Status: ready, Reason: reason, Message: msg,
		ObservedGeneration: want.ObservedGeneration}, c.cfg.Clock.Now())
	return want
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

// writeStatus updates r's status when it differs from what it should be.
func (c *Controller) writeStatus(ctx context.Context, r resource, v verdict, current *identitymap.Map) error {
	want := c.status(r, v, current)
	if reflect.DeepEqual(normalize(r.cr.Status), normalize(want)) {
		return nil
	}
	written, err := crdcontroller.UpdateStatus(ctx, c.cfg.Dynamic.Resource(GVR), r.obj, &want)
	if err != nil {
		return fmt.Errorf("status of %s %s: %w", Kind, r.obj.GetName(), err)
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
	if len(s.Conflicts) == 0 {
		s.Conflicts = nil
	}
	return s
}
