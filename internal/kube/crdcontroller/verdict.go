package crdcontroller

import (
	"fmt"
	"reflect"
	"strings"
)

// ReasonInvalid is the Ready reason of a resource whose spec is refused;
// the message names the field.
const ReasonInvalid = "Invalid"

// ConditionReady is the condition a RuleSet sets on each resource.
const ConditionReady = "Ready"

// Verdict is what a sync decided about one resource.
type Verdict[R any] struct {
	// Invalid says why the current generation is refused.
	Invalid string
	// Rule is the rule handed to Apply for the resource, if any: the
	// current generation's, the last valid one's, or a stand-in.
	Rule *R
	// Generation is Rule's.
	Generation int64
	// Standin: Rule is RuleSetConfig.Standin's.
	Standin bool
	// NotInForce says why Rule is not in force: Apply refused the set, and
	// the set it last accepted lacks Rule.
	NotInForce string
}

// InForce is the resource's rule in force, nil if none (or a stand-in).
func (v Verdict[R]) InForce() *R {
	if v.NotInForce != "" || v.Standin {
		return nil
	}
	return v.Rule
}

// Words are how a controller names outcomes in statuses, events and its
// Resources metric, whose states are the lowercased reasons plus
// "invalid" and "invalid_last_valid_applied".
type Words struct {
	// InForce is the Ready reason of a resource whose rule is in force
	// ("Applied").
	InForce string
	// NotInForce is the Ready reason of a resource whose rule Apply
	// refused ("Conflict"), NotInForceNote what its message says before
	// Apply's error ("not applied").
	NotInForce, NotInForceNote string
	// Kept says that an invalid resource's last valid generation stays
	// ("stays applied"); NoneKept ends the message of one with none to
	// keep, StandinKept of one a stand-in replaces.
	Kept, NoneKept, StandinKept string
}

// settle notes whether v's rule is in force: Apply accepted it, now or
// before (a refused set leaves the last accepted one in force).
func (v *Verdict[R]) settle(applied []R, applyErr error, note string) {
	if v.Rule == nil || applyErr == nil {
		return
	}
	for _, r := range applied {
		if reflect.DeepEqual(r, *v.Rule) {
			return
		}
	}
	v.NotInForce = note + ": " + applyErr.Error()
}

// refusal is the reason and note of v's refusal, "" when it has none.
func (v Verdict[R]) refusal(w Words) (reason, note string) {
	switch {
	case v.Invalid != "":
		return ReasonInvalid, v.Invalid + v.lastGood(w)
	case v.NotInForce != "":
		return w.NotInForce, v.NotInForce
	}
	return "", ""
}

// lastGood says what stays of an invalid resource.
func (v Verdict[R]) lastGood(w Words) string {
	switch {
	case v.Rule == nil:
		return w.NoneKept
	case v.Standin:
		return w.StandinKept
	case v.NotInForce != "":
		return fmt.Sprintf("; generation %d was valid but is %s", v.Generation, v.NotInForce)
	}
	return fmt.Sprintf("; generation %d %s", v.Generation, w.Kept)
}

// state is v's label in the Resources metric.
func (v Verdict[R]) state(w Words) string {
	switch {
	case v.NotInForce != "":
		return strings.ToLower(w.NotInForce)
	case v.Invalid != "" && v.Rule != nil && !v.Standin:
		return "invalid_last_valid_applied"
	case v.Invalid != "":
		return "invalid"
	}
	return strings.ToLower(w.InForce)
}
