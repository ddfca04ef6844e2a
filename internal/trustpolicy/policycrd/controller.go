package policycrd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
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
	rules   *crdcontroller.RuleSet[ClusterTrustPolicy, trustpolicy.Rule, Status]
}

type (
	resource = crdcontroller.Resource[ClusterTrustPolicy]
	verdict  = crdcontroller.Verdict[trustpolicy.Rule]
)

// New checks cfg; it starts nothing.
func New(cfg Config) (*Controller, error) {
	if cfg.Dynamic == nil || cfg.Apply == nil || cfg.LocalTrustDomain.IsZero() {
		return nil, errors.New("policycrd: Dynamic, Apply and LocalTrustDomain are required")
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	c := &Controller{cfg: cfg, metrics: newMetrics()}
	var err error
	c.rules, err = crdcontroller.NewRuleSet(crdcontroller.RuleSetConfig[ClusterTrustPolicy, trustpolicy.Rule, Status]{
		Config: crdcontroller.Config{Dynamic: cfg.Dynamic, GVR: GVR, Kind: Kind, Events: cfg.Events, Interval: cfg.StatusInterval,
			Clock: cfg.Clock, Logger: cfg.Logger},
		Rule: c.rule, Standin: c.governOnly, Apply: cfg.Apply.Apply, Status: c.status,
		StatusOf: func(cr *ClusterTrustPolicy) Status { return cr.Status },
		IsLeader: cfg.IsLeader, Metrics: c.metrics, Registerer: cfg.Registerer, Words: words,
	})
	if err != nil {
		return nil, fmt.Errorf("policycrd: %w", err)
	}
	return c, nil
}

// Synced is closed once the rules of every resource listed at start were
// applied: until then a workload lacks what resources grant it, so the
// server may hold back SDS answers (or readiness) until it is closed.
func (c *Controller) Synced() <-chan struct{} { return c.rules.Synced() }

// Rules returns the rules Apply last accepted.
func (c *Controller) Rules() []trustpolicy.Rule { return c.rules.Applied() }

// Run watches the resources until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.rules.Run(ctx); err != nil {
		return fmt.Errorf("policycrd: %w", err)
	}
	return nil
}

// rule is the rule a resource makes, checked alone.
func (c *Controller) rule(name string, cr *ClusterTrustPolicy) (trustpolicy.Rule, error) {
	rule := RuleOf(name, cr.Spec)
	return rule, Check(c.cfg.LocalTrustDomain, rule)
}

// governOnly stands for a resource that is invalid with no valid
// generation to keep (as after a restart): it grants nothing but keeps
// the trust domains it names governed, so that they do not fall to the
// default and reach every workload. Nil when it names none that parse.
func (c *Controller) governOnly(name string, cr *ClusterTrustPolicy) *trustpolicy.Rule {
	tds := make([]string, len(cr.Spec.TrustDomains))
	for i, g := range cr.Spec.TrustDomains {
		tds[i] = g.Name
	}
	return trustpolicy.GovernOnlyRule(RuleName(name), OriginPrefix+name, c.cfg.LocalTrustDomain, tds)
}
