package policycrd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// DefaultStatusInterval is Config.StatusInterval's default: how often the
// statuses follow the matched workloads.
const DefaultStatusInterval = 30 * time.Second

// Applier takes the rules of every valid resource, the whole set each
// time (trustpolicy.Combiner.SetSource("crd", rules) behind an ApplyFunc).
// An error keeps the set it last accepted.
type Applier interface {
	Apply(rules []trustpolicy.Rule) error
}

// ApplyFunc adapts a function to Applier.
type ApplyFunc func(rules []trustpolicy.Rule) error

// Apply calls f.
func (f ApplyFunc) Apply(rules []trustpolicy.Rule) error { return f(rules) }

// Config configures a Controller.
type Config struct {
	// Dynamic reads the resources and writes their status. Required.
	Dynamic dynamic.Interface
	// Events, when set, records events (events.k8s.io/v1) on refused
	// resources; cluster-scoped objects' events land in namespace default.
	Events kubernetes.Interface
	// LocalTrustDomain is the server's own. Required.
	LocalTrustDomain spiffeid.TrustDomain
	// Apply receives the valid rules after every change. Required.
	Apply Applier
	// Matched reports how many workloads a rule selected and the SPIFFE
	// IDs of the last ones (trustpolicy.Access records them); nil leaves
	// status.matchedWorkloads unset.
	Matched func(rule string) (count int, recent []string)
	// Conflicts reports what the server finds at odds between a rule and
	// the others (status.conflicts); nil reports none.
	Conflicts func(rule string) []string
	// IsLeader: only the leader writes status and events; nil means
	// always. Every replica applies the resources, so every replica's
	// SDS streams follow the same policy.
	IsLeader func() bool
	// StatusInterval: default DefaultStatusInterval.
	StatusInterval time.Duration
	Clock          clock.WithTicker
	Logger         *slog.Logger
	Registerer     prometheus.Registerer
}

// Controller turns ClusterTrustPolicy resources into trust policy rules
// and reports in each resource's status whether it is applied.
type Controller struct {
	cfg     Config
	metrics *crdcontroller.Metrics

	mu sync.Mutex
	// valid is each resource's last valid rule, with its generation: an
	// edit that makes a resource invalid leaves its last valid rule
	// applied.
	valid map[string]validRule
	// applied is the set Apply last accepted; synced once it accepted one.
	applied []trustpolicy.Rule
	synced  bool
	// firstApply is closed once Apply accepted a set.
	firstApply chan struct{}
	// refused records, per resource, the refusal last reported as an
	// event, so each is reported once.
	refused map[string]string
}

type validRule struct {
	rule       trustpolicy.Rule
	generation int64
}

// New checks cfg; it starts nothing.
func New(cfg Config) (*Controller, error) {
	if cfg.Dynamic == nil || cfg.Apply == nil || cfg.LocalTrustDomain.IsZero() {
		return nil, errors.New("policycrd: Dynamic, Apply and LocalTrustDomain are required")
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("policycrd: %w", err)
	}
	return &Controller{cfg: cfg, metrics: m, valid: map[string]validRule{}, refused: map[string]string{}, firstApply: make(chan struct{})}, nil
}

// Synced is closed once the rules of every resource listed at start were
// applied: until then a workload lacks what resources grant it, so the
// server may hold back SDS answers (or readiness) until it is closed.
func (c *Controller) Synced() <-chan struct{} { return c.firstApply }

// Rules returns the rules Apply last accepted.
func (c *Controller) Rules() []trustpolicy.Rule {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.applied)
}

// Run watches the resources until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	err := crdcontroller.Run(ctx, crdcontroller.Config{
		Dynamic: c.cfg.Dynamic, GVR: GVR, Kind: "ClusterTrustPolicy",
		Events: c.cfg.Events, Interval: c.cfg.StatusInterval, Sync: c.sync, SyncErrors: c.metrics.SyncErrors,
		Clock: c.cfg.Clock, Logger: c.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("policycrd: %w", err)
	}
	return nil
}

// resource is a listed object, decoded.
type resource struct {
	obj *unstructured.Unstructured
	cr  ClusterTrustPolicy
	err error // decoding failed
}

// sync applies every valid resource and updates statuses.
func (c *Controller) sync(ctx context.Context, l crdcontroller.Lister, recorder events.EventRecorder) error {
	objs, err := l.List(labels.Everything())
	if err != nil {
		return err
	}
	rs := decode(objs)
	c.mu.Lock()
	verdicts, valid := judge(rs, c.valid, c.cfg.LocalTrustDomain)
	c.valid = valid
	for name := range c.refused {
		if !slices.ContainsFunc(rs, func(r resource) bool { return r.obj.GetName() == name }) {
			delete(c.refused, name) // deleted: a re-created one is reported afresh
		}
	}
	applyErr := c.apply(verdicts)
	applied := c.applied
	c.mu.Unlock()

	states := make([]string, len(verdicts))
	for i := range verdicts {
		verdicts[i].settle(applied, applyErr)
		states[i] = verdicts[i].state()
	}
	c.metrics.SetStates(states)
	if c.cfg.IsLeader != nil && !c.cfg.IsLeader() {
		return applyErr
	}
	errs := []error{applyErr}
	for i, r := range rs {
		v := verdicts[i]
		c.report(r, v, recorder)
		if err := c.writeStatus(ctx, r, v); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// apply hands the verdicts' rules to Apply when they differ from the set
// it last accepted. Called with mu held.
func (c *Controller) apply(verdicts []verdict) error {
	var rules []trustpolicy.Rule
	for _, v := range verdicts {
		if v.rule != nil {
			rules = append(rules, *v.rule)
		}
	}
	if c.synced && reflect.DeepEqual(rules, c.applied) {
		return nil // a status write or a tick: the policy is unchanged
	}
	if err := c.cfg.Apply.Apply(rules); err != nil {
		// The rules were checked one by one; what Apply refuses conflicts
		// with another source (a file rule of the same name, say).
		return fmt.Errorf("applying %d ClusterTrustPolicy rules: %w", len(rules), err)
	}
	if !c.synced {
		close(c.firstApply)
	}
	c.applied, c.synced = rules, true
	return nil
}

// decode decodes the listed resources (a resource that does not decode is
// kept, with its error), by name: the rules' order.
func decode(objs []runtime.Object) []resource {
	var rs []resource
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		r := resource{obj: u}
		r.err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r.cr)
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b resource) int { return cmp.Compare(a.obj.GetName(), b.obj.GetName()) })
	return rs
}

// judge decides, without side effects, which rule each resource applies:
// its own if valid, else its last valid one from valid. The returned map
// holds the present resources only, so a deleted resource's rule goes.
func judge(rs []resource, valid map[string]validRule, local spiffeid.TrustDomain) ([]verdict, map[string]validRule) {
	verdicts := make([]verdict, len(rs))
	next := map[string]validRule{}
	for i, r := range rs {
		name := r.obj.GetName()
		v := &verdicts[i]
		if r.err != nil {
			v.invalid = "spec does not decode: " + r.err.Error()
		} else {
			rule := RuleOf(name, r.cr.Spec)
			if err := Check(local, rule); err != nil {
				v.invalid = err.Error()
			} else {
				next[name] = validRule{rule: rule, generation: r.obj.GetGeneration()}
			}
		}
		vr, ok := next[name]
		if !ok {
			vr, ok = valid[name]
		}
		switch {
		case ok:
			next[name] = vr
			v.rule, v.generation = &vr.rule, vr.generation
		case r.err == nil:
			v.rule, v.governOnly = governOnly(name, r.cr.Spec, local), true
		}
	}
	return verdicts, next
}

// governOnly stands for a resource that is invalid with no valid
// generation to keep (as after a restart): it grants nothing but keeps
// the trust domains it names governed, so that they do not fall to the
// default and reach every workload. Nil when it names none that parse.
func governOnly(name string, spec Spec, local spiffeid.TrustDomain) *trustpolicy.Rule {
	tds := make([]string, len(spec.TrustDomains))
	for i, g := range spec.TrustDomains {
		tds[i] = g.Name
	}
	return trustpolicy.GovernOnlyRule(RuleName(name), OriginPrefix+name, local, tds)
}

// verdict is what sync decided about one resource.
type verdict struct {
	invalid    string            // the current generation is refused: why
	rule       *trustpolicy.Rule // the rule handed to Apply, if any
	governOnly bool              // rule is governOnly's stand-in for an invalid resource
	generation int64             // of rule
	conflict   string            // Apply refused the set and rule is not in force
}

// settle notes whether v's rule is in force: Apply accepted it, now or
// before (a refused set leaves the last accepted one in force).
func (v *verdict) settle(applied []trustpolicy.Rule, applyErr error) {
	if v.rule == nil || applyErr == nil {
		return
	}
	for _, r := range applied {
		if r.Name == v.rule.Name && reflect.DeepEqual(r, *v.rule) {
			return
		}
	}
	v.conflict = "not applied: " + applyErr.Error()
}

// lastGood says what stays of an invalid resource.
func (v verdict) lastGood() string {
	switch {
	case v.rule == nil:
		return ""
	case v.governOnly:
		return "; no valid generation to keep: it grants nothing, and the trust domains it names stay withheld from every workload no other rule grants them to"
	case v.conflict != "":
		return fmt.Sprintf("; generation %d was valid but is %s", v.generation, v.conflict)
	}
	return fmt.Sprintf("; generation %d stays applied", v.generation)
}

func (v verdict) state() string {
	switch {
	case v.conflict != "":
		return "conflict"
	case v.invalid != "" && v.rule != nil && !v.governOnly:
		return "invalid_last_valid_applied"
	case v.invalid != "":
		return "invalid"
	}
	return "applied"
}

// report logs and records an event for a refusal, once per generation and
// message.
func (c *Controller) report(r resource, v verdict, recorder events.EventRecorder) {
	name := r.obj.GetName()
	var reason, note string
	switch {
	case v.invalid != "":
		reason, note = ReasonInvalid, v.invalid+v.lastGood()
	case v.conflict != "":
		reason, note = ReasonConflict, v.conflict
	default:
		delete(c.refused, name)
		return
	}
	if crdcontroller.Refused(c.refused, recorder, r.obj, reason, note) {
		c.cfg.Logger.Warn("ClusterTrustPolicy refused: "+reason, logattr.Rule, name, logattr.Error, note)
	}
}
