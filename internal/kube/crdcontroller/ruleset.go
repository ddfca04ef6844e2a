package crdcontroller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Resource is a listed object and what it decodes to.
type Resource[T any] struct {
	Obj *unstructured.Unstructured
	CR  T
	// Err is why Obj does not decode (only without the CRD's schema).
	Err error
}

// RuleSetConfig configures a RuleSet: Config says what Run watches (its
// Sync and SyncErrors are the RuleSet's), the functions what is the
// controller's own. T is the resource's Go type, R a rule, S a status.
type RuleSetConfig[T, R, S any] struct {
	Config
	// Rule is the rule the resource named name makes, or why it is
	// refused, naming the field. Required.
	Rule func(name string, cr *T) (R, error)
	// Standin, when set, is what a resource applies that is invalid with
	// no valid generation to keep (nil: nothing).
	Standin func(name string, cr *T) *R
	// Apply receives the rules, the whole set, when it changed; an error
	// keeps the set it last accepted. Required.
	Apply func(rules []R) error
	// Status is what r's status should be under v (see RuleSet.Ready),
	// with empty lists nil; StatusOf is the status cr has. Required.
	Status   func(r Resource[T], v Verdict[R]) S
	StatusOf func(cr *T) S
	// IsLeader: only the leader writes statuses and events; nil means
	// always.
	IsLeader func() bool
	// Metrics are registered with Registerer (nil: nowhere). Required.
	Metrics    *Metrics
	Registerer prometheus.Registerer
	Words      Words
}

// RuleSet turns every resource of a kind into one rule, applies them as
// one set and reports in each resource's status what became of it. A
// resource refused alone keeps its last valid generation's rule, and a
// set Apply refuses keeps the set it last accepted.
type RuleSet[T, R, S any] struct {
	cfg RuleSetConfig[T, R, S]

	mu sync.Mutex
	// valid is each resource's last valid rule, with its generation.
	valid map[string]kept[R]
	// applied is the set Apply last accepted; synced once it accepted one.
	applied []R
	synced  bool
	// firstApply is closed once Apply accepted a set.
	firstApply chan struct{}
	// refused holds the refusals reported (Refused), by resource; only
	// Sync, never concurrent, uses it.
	refused map[string]string
}

type kept[R any] struct {
	rule       R
	generation int64
}

// NewRuleSet checks cfg; it starts nothing.
func NewRuleSet[T, R, S any](cfg RuleSetConfig[T, R, S]) (*RuleSet[T, R, S], error) {
	if cfg.Rule == nil || cfg.Apply == nil || cfg.Status == nil || cfg.StatusOf == nil || cfg.Metrics == nil {
		return nil, errors.New("crdcontroller: Rule, Apply, Status, StatusOf and Metrics are required")
	}
	if err := cfg.Metrics.Register(cfg.Registerer); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &RuleSet[T, R, S]{cfg: cfg, valid: map[string]kept[R]{}, refused: map[string]string{}, firstApply: make(chan struct{})}, nil
}

// Synced is closed once Apply accepted a set: the rules of every resource
// listed at start.
func (s *RuleSet[T, R, S]) Synced() <-chan struct{} { return s.firstApply }

// Applied returns the set Apply last accepted.
func (s *RuleSet[T, R, S]) Applied() []R {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.applied)
}

// Run watches the resources (Run) until ctx is done.
func (s *RuleSet[T, R, S]) Run(ctx context.Context) error {
	cfg := s.cfg.Config
	cfg.Sync, cfg.SyncErrors = s.Sync, s.cfg.Metrics.SyncErrors
	return Run(ctx, cfg)
}

// Sync applies every listed resource's rule and, on the leader, reports
// refusals and writes the statuses that changed. It is the SyncFunc Run
// calls.
func (s *RuleSet[T, R, S]) Sync(ctx context.Context, l Lister, recorder events.EventRecorder) error {
	objs, err := l.List(labels.Everything())
	if err != nil {
		return err
	}
	rs := decode[T](objs)
	verdicts, applyErr := s.update(rs)
	states := make([]string, len(verdicts))
	for i, v := range verdicts {
		states[i] = v.state(s.cfg.Words)
	}
	s.cfg.Metrics.SetStates(states)
	if s.cfg.IsLeader != nil && !s.cfg.IsLeader() {
		return applyErr
	}
	errs := []error{applyErr}
	for i, r := range rs {
		s.report(r, verdicts[i], recorder)
		errs = append(errs, s.writeStatus(ctx, r, verdicts[i]))
	}
	return errors.Join(errs...)
}

// decode decodes the listed objects (one that does not decode is kept,
// with its error), by name: the rules' order.
func decode[T any](objs []runtime.Object) []Resource[T] {
	var rs []Resource[T]
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		r := Resource[T]{Obj: u}
		r.Err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r.CR)
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b Resource[T]) int { return cmp.Compare(a.Obj.GetName(), b.Obj.GetName()) })
	return rs
}

// update judges rs, applies their rules and notes which are in force.
func (s *RuleSet[T, R, S]) update(rs []Resource[T]) ([]Verdict[R], error) {
	s.mu.Lock()
	verdicts := s.judge(rs)
	for name := range s.refused {
		if !slices.ContainsFunc(rs, func(r Resource[T]) bool { return r.Obj.GetName() == name }) {
			delete(s.refused, name) // deleted: a re-created one is reported afresh
		}
	}
	applyErr := s.apply(verdicts)
	applied := s.applied
	s.mu.Unlock()
	for i := range verdicts {
		verdicts[i].settle(applied, applyErr, s.cfg.Words.NotInForceNote)
	}
	return verdicts, applyErr
}

// judge decides which rule each resource applies: its own if valid, else
// its last valid one, else a stand-in. Called with mu held; s.valid keeps
// the present resources only, so a deleted resource's rule goes.
func (s *RuleSet[T, R, S]) judge(rs []Resource[T]) []Verdict[R] {
	verdicts := make([]Verdict[R], len(rs))
	next := map[string]kept[R]{}
	for i, r := range rs {
		name, v := r.Obj.GetName(), &verdicts[i]
		if r.Err != nil {
			v.Invalid = "spec does not decode: " + r.Err.Error()
		} else if rule, err := s.cfg.Rule(name, &r.CR); err != nil {
			v.Invalid = err.Error()
		} else {
			next[name] = kept[R]{rule: rule, generation: r.Obj.GetGeneration()}
		}
		k, ok := next[name]
		if !ok {
			k, ok = s.valid[name]
		}
		switch {
		case ok:
			next[name] = k
			v.Rule, v.Generation = &k.rule, k.generation
		case r.Err == nil && s.cfg.Standin != nil:
			v.Rule = s.cfg.Standin(name, &r.CR)
			v.Standin = v.Rule != nil
		}
	}
	s.valid = next
	return verdicts
}

// apply hands the verdicts' rules to Apply when they differ from the set
// it last accepted. Called with mu held.
func (s *RuleSet[T, R, S]) apply(verdicts []Verdict[R]) error {
	var rules []R
	for _, v := range verdicts {
		if v.Rule != nil {
			rules = append(rules, *v.Rule)
		}
	}
	if s.synced && reflect.DeepEqual(rules, s.applied) {
		return nil // a status write or a tick: the set is unchanged
	}
	if err := s.cfg.Apply(rules); err != nil {
		// The rules were checked one by one; what Apply refuses conflicts
		// with another source (a file rule of the same name, say).
		return fmt.Errorf("applying %d %s rules: %w", len(rules), s.cfg.Kind, err)
	}
	if !s.synced {
		close(s.firstApply)
	}
	s.applied, s.synced = rules, true
	return nil
}

// report logs and records an event for a refusal, once per generation and
// message (Refused).
func (s *RuleSet[T, R, S]) report(r Resource[T], v Verdict[R], recorder events.EventRecorder) {
	name := r.Obj.GetName()
	reason, note := v.refusal(s.cfg.Words)
	if reason == "" {
		delete(s.refused, name)
		return
	}
	if Refused(s.refused, recorder, r.Obj, reason, note) {
		s.cfg.Logger.Warn(s.cfg.Kind+" refused: "+reason, logattr.Rule, name, logattr.Error, note)
	}
}

// Ready is the conditions of r's status under v: its Ready condition,
// whose message is inForce when v's rule is in force, with old the
// conditions r's status has (SetCondition).
func (s *RuleSet[T, R, S]) Ready(r Resource[T], v Verdict[R], old []metav1.Condition, inForce string) []metav1.Condition {
	cond := metav1.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: s.cfg.Words.InForce, Message: inForce,
		ObservedGeneration: r.Obj.GetGeneration()}
	if reason, note := v.refusal(s.cfg.Words); reason != "" {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, reason, note
	}
	var conds []metav1.Condition
	SetCondition(&conds, old, cond, s.cfg.Clock.Now())
	return conds
}

// writeStatus updates r's status when it differs from what it should be,
// so that a periodic sync with nothing new writes nothing. Plain equality
// holds across the API server's round trip as long as Status leaves empty
// lists nil (omitempty drops them) and Ready keeps the stored transition
// time (it copies it); semantic equality would cost a third more per sync.
func (s *RuleSet[T, R, S]) writeStatus(ctx context.Context, r Resource[T], v Verdict[R]) error {
	want := s.cfg.Status(r, v)
	if reflect.DeepEqual(s.cfg.StatusOf(&r.CR), want) {
		return nil
	}
	written, err := UpdateStatus(ctx, s.cfg.Dynamic.Resource(s.cfg.GVR), r.Obj, &want)
	if err != nil {
		return fmt.Errorf("status of %s %s: %w", s.cfg.Kind, r.Obj.GetName(), err)
	}
	if written {
		s.cfg.Metrics.StatusWrites.Inc()
	}
	return nil
}
