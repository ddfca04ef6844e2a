package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/internal/trustpolicy/policycrd"
)

// crdPolicySource is the Combiner source of ClusterTrustPolicy resources.
const crdPolicySource = "crd"

// errPolicyCRDStorage refuses --trust-policy-crd without Kubernetes.
var errPolicyCRDStorage = errors.New("--trust-policy-crd needs --storage kube: the resources are read from the API server, and every replica applies them")

// wireAccess builds what SDS asks per caller: the Access over the policy,
// reading service account labels from the API server when there is one
// (without one, label selectors select nobody), and with --trust-policy-crd
// the ClusterTrustPolicy controller feeding the Combiner.
func (p *policySetup) wireAccess(k *kubeSetup, td spiffeid.TrustDomain, reg prometheus.Registerer, logger *slog.Logger) error {
	if k != nil {
		sa, err := policycrd.NewServiceAccountLabels(k.client, logger.With(logattr.Component, "trust-policy-labels"))
		if err != nil {
			return err
		}
		p.labels = sa
		p.kubeRunners = append(p.kubeRunners, sa.Run)
	}
	p.access = trustpolicy.NewAccess(p.cell, p.labels)
	p.sdsAccess = p.access
	if k == nil || !k.o.trustPolicyCRD {
		return nil
	}
	ctl, err := policycrd.New(policycrd.Config{
		Dynamic: k.dynamic, Events: k.client, LocalTrustDomain: td,
		Apply: policycrd.ApplyFunc(p.applyCRD),
		Matched: func(rule string) (int, []string) {
			m := p.access.Matched(rule)
			return m.Count, m.Recent
		},
		Conflicts: p.conflictsOf,
		IsLeader:  k.elector.IsLeader,
		Logger:    logger.With(logattr.Component, "trust-policy-crd"), Registerer: reg,
	})
	if err != nil {
		return err
	}
	gate, err := newCRDGate(p.access, ctl.Synced(), td)
	if err != nil {
		return err
	}
	p.sdsAccess = gate
	p.kubeRunners = append(p.kubeRunners, ctl.Run, func(ctx context.Context) error {
		return gate.watch(ctx, policyCRDSyncWarn, p.logger)
	})
	return nil
}

// applyCRD hands the resources' rules to the Combiner; a refusal (a rule
// name another source uses) is audited once per distinct error.
func (p *policySetup) applyCRD(rules []trustpolicy.Rule) error {
	err := p.combiner.SetSource(crdPolicySource, rules)
	p.mu.Lock()
	fresh := err != nil && (p.crdErr == nil || p.crdErr.Error() != err.Error())
	p.crdErr = err
	p.mu.Unlock()
	if fresh {
		p.rejected(crdPolicySource, err)
	}
	return err
}

// policyCRDSyncWarn is how long the server waits for the first read of
// the ClusterTrustPolicy resources before it warns that it serves only the
// local trust domain meanwhile.
const policyCRDSyncWarn = 30 * time.Second

// crdGate makes SDS fail closed until the ClusterTrustPolicy resources
// have been read: until then a resource limiting a trust domain may not be
// known yet, so every caller gets the local trust domain only (a restart
// or a failover must not hand every workload every federated trust domain
// for as long as the informer takes, or forever when it cannot list).
type crdGate struct {
	access *trustpolicy.Access
	synced <-chan struct{}
	local  *trustpolicy.Policy // no rules, default deny: the local trust domain only
}

func newCRDGate(access *trustpolicy.Access, synced <-chan struct{}, td spiffeid.TrustDomain) (*crdGate, error) {
	local, err := trustpolicy.Compile(td, trustpolicy.DefaultDeny, nil)
	if err != nil {
		return nil, err
	}
	return &crdGate{access: access, synced: synced, local: local}, nil
}

// Decide is the Access's decision once the resources were read, and the
// local trust domain only before, with a channel that fires when they are.
func (g *crdGate) Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	select {
	case <-g.synced:
		return g.access.Decide(ident)
	default:
		return g.local.Decide(trustpolicy.SubjectOf(ident)), g.synced
	}
}

// watch warns when the resources were not read within warnAfter, and
// says when they are. It returns only when ctx is done: the server is a
// runall group, where any part that returns stops every other.
func (g *crdGate) watch(ctx context.Context, warnAfter time.Duration, logger *slog.Logger) error {
	g.warnUntilSynced(ctx, warnAfter, logger)
	<-ctx.Done()
	return nil
}

func (g *crdGate) warnUntilSynced(ctx context.Context, warnAfter time.Duration, logger *slog.Logger) {
	t := time.NewTimer(warnAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-g.synced:
		return
	case <-t.C:
	}
	logger.Warn("ClusterTrustPolicy resources not read yet: SDS hands every workload only the local trust domain until they are; check that the CRD is installed (deploy/base/trustpolicy-crd.yaml), the server may list clustertrustpolicies, and the trust-policy-crd logs",
		"waited", warnAfter.String())
	select {
	case <-ctx.Done():
	case <-g.synced:
		logger.Info("ClusterTrustPolicy resources read: SDS applies the trust policy")
	}
}

// conflictsOf is what the policy finds at odds with rule, for its
// ClusterTrustPolicy status: a lookup in the policy's conflicts, found
// once per policy, not a scan per resource per status update.
func (p *policySetup) conflictsOf(rule string) []string {
	var out []string
	for _, c := range p.combiner.ConflictsOf(rule) {
		out = append(out, c.Message)
	}
	return out
}

// closeAccess ends the Access's signal merger when the server stops.
func (p *policySetup) closeAccess(ctx context.Context) error {
	<-ctx.Done()
	p.access.Close()
	return nil
}
