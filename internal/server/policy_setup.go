package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/admin"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

// policySetup is the server's trust policy: the Cell SDS reads, the
// Combiner of its sources (--trust-policy, the --config file's
// trustPolicy, ClusterTrustPolicy resources), and the audit trail of its
// changes.
type policySetup struct {
	o          PolicyConfig
	cell       *trustpolicy.Cell
	combiner   *trustpolicy.Combiner
	trail      *auditTrail
	logger     *slog.Logger
	configPath string

	mu      sync.Mutex
	started bool // changes before are the start's, recorded as one

	// file polls --trust-policy; nil without it.
	file *trustpolicy.FileSource
	// access decides for SDS callers; kubeRunners read the API server
	// for it (service account labels, ClusterTrustPolicy resources).
	access      *trustpolicy.Access
	sdsAccess   sds.AccessPolicy        // access, gated until ClusterTrustPolicy resources are read
	crdErr      error                   // the ClusterTrustPolicy set last refused; under mu
	labels      trustpolicy.LabelSource // nil without Kubernetes
	kubeRunners []func(context.Context) error
}

// setupPolicy builds the policy from the flags and files. A bad policy at
// start is an error naming the file, line and rule.
func setupPolicy(o Config, td spiffeid.TrustDomain, kube *kubeSetup, trail *auditTrail, reg prometheus.Registerer, logger *slog.Logger) (*policySetup, error) {
	// Zero options (tests, embedders) mean the flags' defaults.
	o.Policy.Default = cmp.Or(o.Policy.Default, string(trustpolicy.DefaultAllow))
	o.Policy.Poll = cmp.Or(o.Policy.Poll, defaultPolicyPoll)
	def, err := trustpolicy.ParseDefault(o.Policy.Default)
	if err != nil {
		return nil, fmt.Errorf("--trust-policy-default: %w", err)
	}
	p := &policySetup{o: o.Policy, cell: trustpolicy.NewCell(nil), trail: trail, configPath: o.ConfigPath,
		logger: logger.With(logattr.Component, "trust-policy")}
	if p.combiner, err = newPolicyCombiner(td, def, p.cell, reg, p.published); err != nil {
		return nil, err
	}
	if o.Policy.File != "" {
		p.file = trustpolicy.NewFileSource(o.Policy.File, p.combiner, p.logger, o.Policy.Poll,
			trustpolicy.WithRefusedHook(p.audited))
		if err := p.file.Load(); err != nil {
			return nil, fmt.Errorf("--trust-policy: %w", err)
		}
	}
	if n := o.Policy.inline; n != nil {
		doc, err := trustpolicy.ParseNode(n, p.configSource())
		if err == nil {
			err = p.combiner.SetSourceDocument(p.configSource(), doc)
		}
		if err != nil {
			return nil, fmt.Errorf("config %s: %s: %w", o.Policy.inlineFrom, trustPolicyKey, err)
		}
	}
	if err := p.wireAccess(kube, td, reg, logger); err != nil {
		return nil, fmt.Errorf("trust policy: %w", err)
	}
	p.start(o.Kube.TrustPolicyCRD, kube != nil)
	return p, nil
}

// newPolicyCombiner is the one place the Combiner is built: its metrics
// on reg, every publication to hook.
func newPolicyCombiner(td spiffeid.TrustDomain, def trustpolicy.Default, cell *trustpolicy.Cell, reg prometheus.Registerer, hook func(trustpolicy.Publish)) (*trustpolicy.Combiner, error) {
	c, err := trustpolicy.NewCombiner(td, def, cell, trustpolicy.WithRegisterer(reg), trustpolicy.WithPublishHook(hook))
	if err != nil {
		return nil, fmt.Errorf("trust policy: %w", err)
	}
	return c, nil
}

func (p *policySetup) configSource() string { return "config:" + p.configPath }

// start says which policy the server starts with, at Warn when there is
// none.
func (p *policySetup) start(crd, kube bool) {
	pol := p.combiner.Policy()
	c := audit.NewPolicyChange("start", nil, pol)
	sources := make([]string, 0, 2)
	for _, st := range p.combiner.Statuses() {
		sources = append(sources, st.Source)
	}
	if c.DigestAfter == "" && !crd {
		p.logger.Warn("no trust policy: every workload receives every federated trust domain",
			"how", "add rules with --trust-policy FILE, the --config file's trustPolicy key or ClusterTrustPolicy resources; --trust-policy-default deny trusts only the local trust domain until a rule grants more (docs/trust-policy.md)")
		return
	}
	p.logger.Info("trust policy in force", "rules", c.Rules, "default", c.Default, "sources", sources, "crd", crd)
	if pol.UsesLabels() && !kube {
		p.logger.Warn("trust policy rules select service accounts by labels, but without Kubernetes (--storage kube) no labels are known: those selectors select no workload")
	}
}

// recordStart appends the policy the server starts with to the audit log,
// after the baseline of what is trusted (serve); changes from then on are
// recorded as they are published.
func (p *policySetup) recordStart() {
	p.mu.Lock()
	p.started = true
	p.mu.Unlock()
	c := audit.NewPolicyChange("start", nil, p.combiner.Policy())
	p.trail.record(audit.Entry{Event: EventPolicyChanged, Policy: &c, Reason: "trust policy in force at start"})
}

// Audit events of the trust policy.
const (
	EventPolicyChanged  = "trust_policy_changed"
	eventPolicyRejected = "trust_policy_rejected"
)

// published records a policy the Combiner published after start, when it
// differs from the one before. It runs under the Combiner's lock: it must
// not call the Combiner.
func (p *policySetup) published(pub trustpolicy.Publish) {
	p.mu.Lock()
	started := p.started
	p.mu.Unlock()
	if !started {
		return
	}
	source := pub.Source
	if source == "" {
		source = "default"
	}
	c := audit.NewPolicyChange(source, pub.Previous, pub.Policy)
	if c.DigestBefore == c.DigestAfter {
		// The same policy again (a source read with nothing new, such as
		// the first read of no ClusterTrustPolicy resources): no change.
		return
	}
	p.trail.record(audit.Entry{Event: EventPolicyChanged, Policy: &c})
	p.logger.Info("trust policy changed", "source", source, "rules", c.Rules, "default", c.Default,
		"rules_added", c.RulesAdded, "rules_removed", c.RulesRemoved, "rules_changed", c.RulesChanged)
}

// rejected records and logs a source's refused change: the last good
// policy stays.
func (p *policySetup) rejected(source string, err error) {
	p.audited(source, err)
	p.logger.Error("trust policy change refused; the last good policy stays in force", "source", source, logattr.Error, err)
}

// audited appends a refused change to the audit log; the FileSource logs
// its own refusals.
func (p *policySetup) audited(source string, err error) {
	pol := p.combiner.Policy()
	c := audit.NewPolicyChange(source, pol, pol) // nothing changed: after is before
	p.trail.record(audit.Entry{Event: eventPolicyRejected, Policy: &c, Reason: err.Error()})
}

// reloadConfig re-reads the --config file's trustPolicy; a file without
// one any more drops its rules.
func (p *policySetup) reloadConfig() error {
	cf, err := rereadConfig(p.configPath)
	src := p.configSource()
	if err == nil {
		if cf.trustPolicy == nil {
			p.combiner.RemoveSource(src)
			return nil
		}
		var doc trustpolicy.Document
		if doc, err = trustpolicy.ParseNode(cf.trustPolicy, src); err == nil {
			err = p.combiner.SetSourceDocument(src, doc)
		}
	}
	if err != nil {
		p.combiner.SetSourceError(src, err)
		p.rejected(src, err)
	}
	return err
}

// reloader is the trust policy's part of SIGHUP: the file and the config
// file's section, read now.
func (p *policySetup) reloader() []reloader {
	var rs []reloader
	if p.file != nil {
		rs = append(rs, reloader{name: "trust policy file", reload: func() (string, error) {
			if err := p.file.Check(); err != nil {
				return "", fmt.Errorf("--trust-policy: %w", err)
			}
			return p.summary(), nil
		}})
	}
	if p.configPath != "" {
		rs = append(rs, reloader{name: "trust policy of --config", reload: func() (string, error) {
			if err := p.reloadConfig(); err != nil {
				return "", err
			}
			return p.summary(), nil
		}})
	}
	return rs
}

func (p *policySetup) summary() string {
	pol := p.combiner.Policy()
	return fmt.Sprintf("%d trust policy rules, default %s", len(pol.Rules()), pol.Default())
}

// runners polls --trust-policy, reads the API server for the policy
// (labels, resources) and closes the Access at the end.
func (p *policySetup) runners() []func(context.Context) error {
	rs := append([]func(context.Context) error{p.closeAccess}, p.kubeRunners...)
	if p.file != nil {
		rs = append(rs, p.file.Run)
	}
	return rs
}

// adminConfig is the policy as the admin API shows and explains it.
func (p *policySetup) adminConfig() *admin.PolicyConfig {
	if p == nil {
		return nil
	}
	cfg := &admin.PolicyConfig{Cell: p.cell, Statuses: p.combiner.Statuses,
		Matches: func(rule string) (uint64, []string) {
			m := p.access.Matched(rule)
			return uint64(m.Count), m.Recent
		}}
	if p.labels != nil {
		cfg.Labels = p.labels.Labels
	}
	return cfg
}

// rereadConfig reads the --config file at path again, checked whole as at
// start, on a scratch flag set: its flag settings are not applied.
func rereadConfig(path string) (*configFile, error) {
	fs := pflag.NewFlagSet("reload", pflag.ContinueOnError)
	var scratch Config
	addServerFlags(fs, &scratch)
	return applyConfigFile(fs, path, func(string) string { return "" })
}
