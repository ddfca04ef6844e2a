package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/internal/trustpolicy/policycrd"
)

// CRDPolicySource is the Combiner source of ClusterTrustPolicy resources.
const CRDPolicySource = "crd"

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
	if k == nil || !k.o.TrustPolicyCRD {
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
	gate, err := policycrd.NewGate(p.access, ctl.Synced(), td)
	if err != nil {
		return err
	}
	p.sdsAccess = gate
	p.kubeRunners = append(p.kubeRunners, ctl.Run, func(ctx context.Context) error {
		return gate.Watch(ctx, policyCRDSyncWarn, p.logger)
	})
	return nil
}

// applyCRD hands the resources' rules to the Combiner; a refusal (a rule
// name another source uses) is audited once per distinct error.
func (p *policySetup) applyCRD(rules []trustpolicy.Rule) error {
	err := p.combiner.SetSource(CRDPolicySource, rules)
	p.mu.Lock()
	fresh := err != nil && (p.crdErr == nil || p.crdErr.Error() != err.Error())
	p.crdErr = err
	p.mu.Unlock()
	if fresh {
		p.rejected(CRDPolicySource, err)
	}
	return err
}

// policyCRDSyncWarn is how long the server waits for the first read of
// the ClusterTrustPolicy resources before it warns that it serves only the
// local trust domain meanwhile.
const policyCRDSyncWarn = 30 * time.Second

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
