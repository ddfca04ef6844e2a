package mapcrd

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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultStatusInterval is Config.StatusInterval's default: how often the
// statuses follow conflicts with rules of other sources (a file edit).
const DefaultStatusInterval = 30 * time.Second

// Source is the identitymap.Combiner source the resources' rules go to.
const Source = "crd"

// Applier takes the rules of every valid resource, the whole set each
// time; an error keeps the set it last accepted.
type Applier interface {
	Apply(rules []identitymap.Rule) error
}

// ApplyFunc adapts a function to Applier.
type ApplyFunc func(rules []identitymap.Rule) error

// Apply calls f.
func (f ApplyFunc) Apply(rules []identitymap.Rule) error { return f(rules) }

// CombinerApplier applies to comb's Source.
func CombinerApplier(comb *identitymap.Combiner) Applier {
	return ApplyFunc(func(rules []identitymap.Rule) error { return comb.SetSource(Source, rules) })
}

// Config configures a Controller.
type Config struct {
	// Dynamic reads the resources and writes their status. Required.
	Dynamic dynamic.Interface
	// Events, when set, records events on refused resources.
	Events kubernetes.Interface
	// Map is what each rule is checked against alone (the trust domain,
	// the maximum TTL). Required: its TrustDomain.
	Map identitymap.Config
	// Apply receives the valid rules after every change. Required.
	Apply Applier
	// Current is the combined map in force, whose conflicts and
	// agent-only rules the statuses show; nil shows none.
	Current func() *identitymap.Map
	// IsLeader: only the leader writes status and events; nil means
	// always. A node agent, which may not write, says never.
	IsLeader func() bool
	// StatusInterval: default DefaultStatusInterval.
	StatusInterval time.Duration
	Clock          clock.WithTicker
	Logger         *slog.Logger
	Registerer     prometheus.Registerer
}

// Controller turns ClusterIdentityMapping resources into identity map
// rules and reports in each resource's status whether it is accepted.
type Controller struct {
	cfg     Config
	metrics *crdcontroller.Metrics

	mu         sync.Mutex
	valid      map[string]validRule // each resource's last valid rule
	applied    []identitymap.Rule   // the set Apply last accepted
	synced     bool
	firstApply chan struct{}
	refused    map[string]string // refusals reported, by resource
}

type validRule struct {
	rule       identitymap.Rule
	generation int64
}

// New checks cfg; it starts nothing.
func New(cfg Config) (*Controller, error) {
	if cfg.Dynamic == nil || cfg.Apply == nil || cfg.Map.TrustDomain.IsZero() {
		return nil, errors.New("mapcrd: Dynamic, Apply and Map.TrustDomain are required")
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
		return nil, fmt.Errorf("mapcrd: %w", err)
	}
	return &Controller{cfg: cfg, metrics: m, valid: map[string]validRule{}, refused: map[string]string{}, firstApply: make(chan struct{})}, nil
}

// Synced is closed once the rules of every resource listed at start were
// applied: until then the map lacks them, so callers fail closed.
func (c *Controller) Synced() <-chan struct{} { return c.firstApply }

// Run watches the resources until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	err := crdcontroller.Run(ctx, crdcontroller.Config{
		Dynamic: c.cfg.Dynamic, GVR: GVR, Kind: Kind,
		Events: c.cfg.Events, Interval: c.cfg.StatusInterval, Sync: c.sync, SyncErrors: c.metrics.SyncErrors,
		Clock: c.cfg.Clock, Logger: c.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("mapcrd: %w", err)
	}
	return nil
}

// resource is a listed object, decoded.
type resource struct {
	obj *unstructured.Unstructured
	cr  ClusterIdentityMapping
	err error // decoding failed
}

// verdict is what sync decided about one resource.
type verdict struct {
	invalid    string            // the current generation is refused: why
	rule       *identitymap.Rule // the rule handed to Apply, if any
	generation int64             // of rule
	refused    string            // Apply refused the set and rule is not in force
}

func (v verdict) state() string {
	switch {
	case v.refused != "":
		return "refused"
	case v.invalid != "" && v.rule != nil:
		return "invalid_last_valid_applied"
	case v.invalid != "":
		return "invalid"
	}
	return "accepted"
}

// sync applies every valid resource and updates statuses.
func (c *Controller) sync(ctx context.Context, l crdcontroller.Lister, recorder events.EventRecorder) error {
	objs, err := l.List(labels.Everything())
	if err != nil {
		return err
	}
	rs := decode(objs)
	c.mu.Lock()
	verdicts := c.judge(rs)
	for name := range c.refused {
		if !slices.ContainsFunc(rs, func(r resource) bool { return r.obj.GetName() == name }) {
			delete(c.refused, name)
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
	var current *identitymap.Map
	if c.cfg.Current != nil {
		current = c.cfg.Current()
	}
	errs := []error{applyErr}
	for i, r := range rs {
		c.report(r, verdicts[i], recorder)
		if err := c.writeStatus(ctx, r, verdicts[i], current); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// judge decides which rule each resource applies: its own if valid, else
// its last valid one. Called with mu held; c.valid keeps the present
// resources only, so a deleted resource's rule goes.
func (c *Controller) judge(rs []resource) []verdict {
	verdicts := make([]verdict, len(rs))
	next := map[string]validRule{}
	for i, r := range rs {
		name := r.obj.GetName()
		v := &verdicts[i]
		if r.err != nil {
			v.invalid = "spec does not decode: " + r.err.Error()
		} else if rule, err := RuleOf(name, r.cr.Spec); err != nil {
			v.invalid = err.Error()
		} else if err := Check(c.cfg.Map, rule); err != nil {
			v.invalid = err.Error()
		} else {
			next[name] = validRule{rule: rule, generation: r.obj.GetGeneration()}
		}
		vr, ok := next[name]
		if !ok {
			vr, ok = c.valid[name]
		}
		if ok {
			next[name] = vr
			v.rule, v.generation = &vr.rule, vr.generation
		}
	}
	c.valid = next
	return verdicts
}

// apply hands the verdicts' rules to Apply when they differ from the set
// it last accepted. Called with mu held.
func (c *Controller) apply(verdicts []verdict) error {
	var rules []identitymap.Rule
	for _, v := range verdicts {
		if v.rule != nil {
			rules = append(rules, *v.rule)
		}
	}
	if c.synced && reflect.DeepEqual(rules, c.applied) {
		return nil
	}
	if err := c.cfg.Apply.Apply(rules); err != nil {
		return fmt.Errorf("applying %d %s rules: %w", len(rules), Kind, err)
	}
	if !c.synced {
		close(c.firstApply)
	}
	c.applied, c.synced = rules, true
	return nil
}

// settle notes whether v's rule is in force: Apply accepted it, now or
// before.
func (v *verdict) settle(applied []identitymap.Rule, applyErr error) {
	if v.rule == nil || applyErr == nil {
		return
	}
	for _, r := range applied {
		if reflect.DeepEqual(r, *v.rule) {
			return
		}
	}
	v.refused = "not in force: " + applyErr.Error()
}

// lastGood says what stays of an invalid resource.
func (v verdict) lastGood() string {
	switch {
	case v.rule == nil:
		return "; no valid generation to keep: the workloads it would select get what the other rules and the default give them"
	case v.refused != "":
		return fmt.Sprintf("; generation %d was valid but is %s", v.generation, v.refused)
	}
	return fmt.Sprintf("; generation %d stays in force", v.generation)
}

// decode decodes the listed resources, by name: the rules' order.
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

// report logs and records an event for a refusal, once per generation and
// message.
func (c *Controller) report(r resource, v verdict, recorder events.EventRecorder) {
	name := r.obj.GetName()
	var reason, note string
	switch {
	case v.invalid != "":
		reason, note = ReasonInvalid, v.invalid+v.lastGood()
	case v.refused != "":
		reason, note = ReasonRefused, v.refused
	default:
		delete(c.refused, name)
		return
	}
	if crdcontroller.Refused(c.refused, recorder, r.obj, reason, note) {
		c.cfg.Logger.Warn(Kind+" refused: "+reason, logattr.Rule, name, logattr.Error, note)
	}
}

// DefaultSyncWarn is how long WatchSync waits for the first read of the
// resources before it warns.
const DefaultSyncWarn = 30 * time.Second

// WatchSync warns when the resources were not read within after (what
// waits on them says what), and says when they are. It returns only when
// ctx is done: servers and agents run it in a group where any part that
// returns stops the others.
func (c *Controller) WatchSync(ctx context.Context, after time.Duration, waiting string) error {
	t := c.cfg.Clock.NewTimer(after)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-c.firstApply:
		<-ctx.Done()
		return nil
	case <-t.C():
	}
	c.cfg.Logger.Warn(Kind+" resources not read yet: "+waiting+"; check that the CRD is installed (deploy/base/identitymapping-crd.yaml) and that this process may list clusteridentitymappings",
		"waited", after.String())
	select {
	case <-ctx.Done():
		return nil
	case <-c.firstApply:
		c.cfg.Logger.Info(Kind + " resources read: the identity map is complete")
	}
	<-ctx.Done()
	return nil
}
