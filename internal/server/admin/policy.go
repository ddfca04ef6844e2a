package admin

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// PolicyConfig is the per-workload trust policy as the admin API shows
// it in /v1/snapshot and explains it at /v1/policy/explain.
type PolicyConfig struct {
	// Cell holds the policy in force (trustpolicy.Cell); a nil policy is
	// no policy: every workload trusts every trust domain.
	Cell interface {
		Load() (*trustpolicy.Policy, <-chan struct{})
	}
	// Statuses reports each source (trustpolicy.Combiner); nil: none.
	Statuses func() []trustpolicy.Status
	// Matches reports how many workloads a rule selected since start and
	// the most recent; nil leaves trusted_by's matched out.
	Matches func(rule string) (count uint64, recent []string)
	// Labels are a service account's labels, for explaining label
	// selectors; nil when the server has no Kubernetes.
	Labels func(namespace, serviceAccount string) map[string]string
}

// maxExplainParam bounds each query parameter of /v1/policy/explain: a
// SPIFFE ID is at most 2048 bytes, names far less.
const maxExplainParam = 2048

// policyView is the trust_policy of /v1/snapshot.
func policyView(cfg *PolicyConfig, p *trustpolicy.Policy) *api.TrustPolicy {
	v := &api.TrustPolicy{Sources: []api.PolicySource{}, Default: string(trustpolicy.DefaultAllow), Conflicts: []string{}, Grants: []api.PolicyGrant{}}
	if cfg.Statuses != nil {
		for _, st := range cfg.Statuses() {
			src := api.PolicySource{Source: st.Source, Rules: st.Rules, LastError: st.LastError}
			if st.LastSuccess > 0 {
				t := time.Unix(st.LastSuccess, 0).UTC()
				src.LastSuccess = &t
			}
			v.Sources = append(v.Sources, src)
		}
	}
	if p == nil {
		return v
	}
	rules := p.Rules()
	v.Rules, v.Default = len(rules), string(p.Default())
	v.TextDigest, v.DecisionDigest = audit.PolicyDigest(p), p.Digest()
	for _, r := range rules {
		for _, g := range r.TrustDomains {
			v.Grants = append(v.Grants, api.PolicyGrant{Rule: r.Name, Origin: r.Origin, TrustDomain: g.TrustDomain})
		}
	}
	for _, c := range p.Conflicts() {
		v.Conflicts = append(v.Conflicts, c.Message)
	}
	return v
}

// trustedBy is who may trust td under p; nil for the local trust domain.
// byTD is rulesByTrustDomain's, built once per snapshot.
func trustedBy(p *trustpolicy.Policy, byTD map[string][]api.PolicyRule, td spiffeid.TrustDomain, local bool) *api.TrustedBy {
	if local {
		return nil
	}
	tb := &api.TrustedBy{Default: string(trustpolicy.DefaultAllow), Rules: []api.PolicyRule{}}
	if p == nil {
		return tb
	}
	tb.Default, tb.Governed = string(p.Default()), p.Governed(td)
	tb.Rules = append(tb.Rules, byTD[td.Name()]...)
	return tb
}

// rulesByTrustDomain is, per trust domain a rule names, the rules naming
// it in policy order, each with its workloads, its peers there and what
// it matched: one pass over the rules however many trust domains the
// snapshot shows.
func rulesByTrustDomain(cfg *PolicyConfig, p *trustpolicy.Policy) map[string][]api.PolicyRule {
	if p == nil {
		return nil
	}
	out := make(map[string][]api.PolicyRule)
	for _, r := range p.Rules() {
		workloads := []string{}
		for _, s := range r.Workloads {
			workloads = append(workloads, SelectorString(s))
		}
		var matched *api.PolicyMatches
		if cfg.Matches != nil {
			n, recent := cfg.Matches(r.Name)
			matched = &api.PolicyMatches{Count: n, Recent: append([]string{}, recent...)}
		}
		for _, g := range r.TrustDomains {
			pr := api.PolicyRule{Name: r.Name, Origin: r.Origin, Workloads: slices.Clone(workloads), Peers: append([]string{}, g.Peers...), Matched: matched}
			out[g.TrustDomain] = append(out[g.TrustDomain], pr)
		}
	}
	return out
}

// SelectorString is one workload selector as one line: its fields
// joined by spaces ("spiffe://td/ns/a/*", "namespace=a labels=tier=api").
func SelectorString(s trustpolicy.Selector) string {
	var parts []string
	if s.SPIFFEID != "" {
		parts = append(parts, s.SPIFFEID)
	}
	if s.Namespace != "" {
		parts = append(parts, "namespace="+s.Namespace)
	}
	if s.Labels != nil {
		parts = append(parts, "labels="+metav1.FormatLabelSelector(s.Labels))
	}
	return strings.Join(parts, " ")
}

// servePolicyExplain answers GET /v1/policy/explain?spiffe_id=...
// [&namespace=N&service_account=S]: what that workload of the local
// trust domain would receive of every trust domain the server trusts,
// and which rule (or the default) decided.
func (h *Handler) servePolicyExplain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for _, k := range []string{"spiffe_id", "namespace", "service_account"} {
		if len(q.Get(k)) > maxExplainParam {
			http.Error(w, k+": longer than 2048 bytes", http.StatusBadRequest)
			return
		}
	}
	id, err := spiffeid.FromString(q.Get("spiffe_id"))
	if err != nil {
		http.Error(w, fmt.Sprintf("spiffe_id %q: %v (want spiffe://%s/<path>)", q.Get("spiffe_id"), err, h.cfg.TrustDomain.Name()), http.StatusBadRequest)
		return
	}
	if !id.MemberOf(h.cfg.TrustDomain) {
		http.Error(w, fmt.Sprintf("spiffe_id %q is not a workload of %s, the trust domain this server issues for", id, h.cfg.TrustDomain.Name()), http.StatusBadRequest)
		return
	}
	sub := trustpolicy.Subject{ID: id, Namespace: q.Get("namespace"), ServiceAccount: q.Get("service_account")}
	if (sub.Namespace == "") != (sub.ServiceAccount == "") {
		http.Error(w, "namespace and service_account go together: a workload proves a service account, which lives in a namespace", http.StatusBadRequest)
		return
	}
	// Like /v1/snapshot this endpoint needs no token, but a wrong one
	// is refused rather than quietly explaining less.
	actor, bearer := h.credential(r)
	if actor == "" && bearer {
		h.unauthorized(w, true)
		return
	}
	p, _ := h.cfg.Policy.Cell.Load()
	note := ""
	if sub.Namespace != "" && h.cfg.Policy.Labels != nil && p.UsesLabels() {
		// Labels are read only for a caller with the admin token or on
		// the admin socket: anyone could otherwise learn which service
		// accounts exist and which labels they carry, one guess at a
		// time.
		if actor != "" {
			sub.Labels = h.cfg.Policy.Labels(sub.Namespace, sub.ServiceAccount)
		} else {
			note = LabelsNotLookedUp
		}
	}
	ex := Explain(p, sub, h.trustDomains())
	ex.LabelsNote = note
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, ex, true)
}

// LabelsNotLookedUp is an explanation's labels_note when the caller had
// no admin token: rules that select by labels then select nothing.
const LabelsNotLookedUp = "service account labels not looked up: ask with the admin token or on the admin socket; rules selecting by labels are explained as not selecting this workload"

// Explain is what sub would receive under p of tds, for people: the
// policy's own explanation in the snapshot's JSON names.
func Explain(p *trustpolicy.Policy, sub trustpolicy.Subject, tds []spiffeid.TrustDomain) api.Explanation {
	var d trustpolicy.Decision
	if p != nil {
		d = p.Decide(sub)
	}
	ex := trustpolicy.Explain(d, sub, tds)
	out := api.Explanation{
		SPIFFEID: sub.ID.String(), Namespace: sub.Namespace, ServiceAccount: sub.ServiceAccount,
		Default: string(ex.Default), Matched: []api.ExplainedMatch{}, TrustDomains: []api.ExplainedTrustDomain{},
	}
	if out.Default == "" {
		out.Default = string(trustpolicy.DefaultAllow)
	}
	for _, m := range ex.Matched {
		out.Matched = append(out.Matched, api.ExplainedMatch{Rule: m.Rule, Origin: m.Origin, Selector: m.Selector})
	}
	for _, t := range ex.TrustDomains {
		peers := append([]string{}, t.Peers...)
		out.TrustDomains = append(out.TrustDomains, api.ExplainedTrustDomain{TrustDomain: t.TrustDomain, Trusted: t.Trusted, Peers: peers, Because: t.Because})
	}
	return out
}

// trustDomains are the trust domains the server trusts or federates
// with, local first: those the snapshot shows, without building one (an
// explain request needs no token; it should cost names, not every
// authority of every bundle).
func (h *Handler) trustDomains() []spiffeid.TrustDomain {
	names := h.trustDomainNames(h.cfg.Trust.Snapshot(), h.federationStatuses())
	out := make([]spiffeid.TrustDomain, 0, len(names))
	for n := range names {
		if td, err := spiffeid.TrustDomainFromString(n); err == nil && td != h.cfg.TrustDomain {
			out = append(out, td)
		}
	}
	slices.SortFunc(out, func(a, b spiffeid.TrustDomain) int { return cmp.Compare(a.Name(), b.Name()) })
	return append([]spiffeid.TrustDomain{h.cfg.TrustDomain}, out...)
}
