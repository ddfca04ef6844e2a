package mapcrd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
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
	rules   *crdcontroller.RuleSet[ClusterIdentityMapping, identitymap.Rule, Status]
}

type (
	resource = crdcontroller.Resource[ClusterIdentityMapping]
	verdict  = crdcontroller.Verdict[identitymap.Rule]
)

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
	c := &Controller{cfg: cfg, metrics: newMetrics()}
	var err error
	c.rules, err = crdcontroller.NewRuleSet(crdcontroller.RuleSetConfig[ClusterIdentityMapping, identitymap.Rule, Status]{
		Config: crdcontroller.Config{Dynamic: cfg.Dynamic, GVR: GVR, Kind: Kind, Events: cfg.Events, Interval: cfg.StatusInterval,
			Clock: cfg.Clock, Logger: cfg.Logger},
		Rule: c.rule, Apply: cfg.Apply.Apply, Status: c.status,
		StatusOf: func(cr *ClusterIdentityMapping) Status { return cr.Status },
		IsLeader: cfg.IsLeader, Metrics: c.metrics, Registerer: cfg.Registerer, Words: words,
	})
	if err != nil {
		return nil, fmt.Errorf("mapcrd: %w", err)
	}
	return c, nil
}

// Synced is closed once the rules of every resource listed at start were
// applied: until then the map lacks them, so callers fail closed.
func (c *Controller) Synced() <-chan struct{} { return c.rules.Synced() }

// Run watches the resources until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.rules.Run(ctx); err != nil {
		return fmt.Errorf("mapcrd: %w", err)
	}
	return nil
}

// rule is the rule a resource makes, checked alone.
func (c *Controller) rule(name string, cr *ClusterIdentityMapping) (identitymap.Rule, error) {
	rule, err := RuleOf(name, cr.Spec)
	if err != nil {
		return rule, err
	}
	return rule, Check(c.cfg.Map, rule)
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
	case <-c.rules.Synced():
		<-ctx.Done()
		return nil
	case <-t.C():
	}
	c.cfg.Logger.Warn(Kind+" resources not read yet: "+waiting+"; check that the CRD is installed (deploy/base/identitymapping-crd.yaml) and that this process may list clusteridentitymappings",
		"waited", after.String())
	select {
	case <-ctx.Done():
		return nil
	case <-c.rules.Synced():
		c.cfg.Logger.Info(Kind + " resources read: the identity map is complete")
	}
	<-ctx.Done()
	return nil
}
