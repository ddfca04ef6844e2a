package api

import (
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// TrustPolicy is the trust policy in force: how many rules, from which
// sources, and what trust domains no rule names get.
type TrustPolicy struct {
	// Sources are the policy's sources ("file:<path>", "config:<path>",
	// "crd") and what each last did.
	Sources []PolicySource `json:"sources"`
	Rules   int            `json:"rules"`
	// Default is "allow" or "deny": what a trust domain no rule names gets.
	Default string `json:"default"`
	// TextDigest identifies the policy as written: its default and every
	// rule with its origin. It is the digest_before/digest_after of the
	// audit log's trust_policy_changed entries, so an entry can be matched
	// to the policy a snapshot shows ("" without a policy).
	TextDigest string `json:"text_digest,omitempty"`
	// DecisionDigest covers what every decision shares besides the
	// rules: the local trust domain, the default and the governed trust
	// domains (trustpolicy.Policy.Digest, from which SDS decision keys
	// derive). Rules that change who is granted what without changing
	// those leave it alone: compare TextDigest for "did the policy
	// change".
	DecisionDigest string `json:"decision_digest,omitempty"`
	// Conflicts are rule combinations an operator should look at, each a
	// sentence naming the rules.
	Conflicts []string `json:"conflicts"`
	// Grants lists every trust domain each rule grants, also those the
	// server does not federate with (which trusted_by cannot show).
	Grants []PolicyGrant `json:"grants"`
}

// None reports whether p is "no policy": no rules and default allow, so
// every workload trusts every federated trust domain. A nil p (a server
// that predates trust policies) is not judged.
func (p *TrustPolicy) None() bool {
	return p != nil && p.Rules == 0 && p.Default == "allow"
}

// PolicySource is what one policy source last did.
type PolicySource struct {
	Source    string `json:"source"`
	Rules     int    `json:"rules"`
	LastError string `json:"last_error,omitempty"`
	// LastSuccess is when the source's rules were last accepted.
	LastSuccess *time.Time `json:"last_success,omitempty"`
}

// PolicyGrant is one trust domain one rule grants.
type PolicyGrant struct {
	Rule        string `json:"rule"`
	Origin      string `json:"origin"`
	TrustDomain string `json:"trust_domain"`
}

// TrustedBy is which local workloads may trust one federated trust domain.
type TrustedBy struct {
	// Default is the policy's default; it decides when Governed is false.
	Default string `json:"default"`
	// Governed is whether a rule names the trust domain: then only the
	// workloads Rules select trust it, whatever the default.
	Governed bool         `json:"governed"`
	Rules    []PolicyRule `json:"rules"`
}

// Everyone reports whether every local workload trusts the trust domain.
func (t TrustedBy) Everyone() bool { return !t.Governed && t.Default == "allow" }

// PolicyRule is one rule granting a trust domain.
type PolicyRule struct {
	Name   string `json:"name"`
	Origin string `json:"origin"`
	// Workloads are the rule's selectors, one string each
	// ("spiffe://td/ns/a/*", "namespace=a", "labels=tier=api", joined
	// by " " when one selector has several fields).
	Workloads []string `json:"workloads"`
	// Peers are the only peers of the trust domain the workloads accept;
	// empty: every member.
	Peers []string `json:"peers"`
	// Matched is which workloads the rule selected since the server
	// started; nil when the server does not record it.
	Matched *PolicyMatches `json:"matched,omitempty"`
}

// PolicyMatches counts the workloads a rule selected.
type PolicyMatches struct {
	Count  uint64   `json:"count"`
	Recent []string `json:"recent"`
}

// Explanation is what one workload would receive under the trust policy
// and why: GET /v1/policy/explain and `trustbridge policy explain`.
type Explanation struct {
	SPIFFEID       string `json:"spiffe_id"`
	Namespace      string `json:"namespace,omitempty"`
	ServiceAccount string `json:"service_account,omitempty"`
	Default        string `json:"default"`
	// LabelsNote, when set, says why the service account's labels were
	// not used (the caller had no admin token): label selectors then
	// select nothing.
	LabelsNote string `json:"labels_note,omitempty"`
	// Matched are the rules that select the workload, in policy order.
	Matched      []ExplainedMatch       `json:"matched"`
	TrustDomains []ExplainedTrustDomain `json:"trust_domains"`
}

// ExplainedMatch is one rule that selects the workload.
type ExplainedMatch struct {
	Rule   string `json:"rule"`
	Origin string `json:"origin"`
	// Selector is the index of the rule's first workload selector that
	// matched.
	Selector int `json:"selector"`
}

// ExplainedTrustDomain is one trust domain of an Explanation.
type ExplainedTrustDomain struct {
	TrustDomain string   `json:"trust_domain"`
	Trusted     bool     `json:"trusted"`
	Peers       []string `json:"peers"` // empty: every member
	Because     string   `json:"because"`
}

// NewTrustPolicy is the snapshot's trust_policy: p (nil: no policy) and
// what each of its sources last did.
func NewTrustPolicy(sources []trustpolicy.Status, p *trustpolicy.Policy) *TrustPolicy {
	v := &TrustPolicy{Sources: policySources(sources), Default: string(trustpolicy.DefaultAllow), Conflicts: []string{}, Grants: []PolicyGrant{}}
	if p == nil {
		return v
	}
	rules := p.Rules()
	v.Rules, v.Default = len(rules), string(p.Default())
	v.TextDigest, v.DecisionDigest = p.TextDigest(), p.Digest()
	for _, r := range rules {
		for _, g := range r.TrustDomains {
			v.Grants = append(v.Grants, PolicyGrant{Rule: r.Name, Origin: r.Origin, TrustDomain: g.TrustDomain})
		}
	}
	for _, c := range p.Conflicts() {
		v.Conflicts = append(v.Conflicts, c.Message)
	}
	return v
}

// NewTrustedBy is the snapshot's trusted_by of td: who may trust it
// under p; nil for the local trust domain. byTD is PolicyRules', built
// once per snapshot.
func NewTrustedBy(p *trustpolicy.Policy, byTD map[string][]PolicyRule, td spiffeid.TrustDomain, local bool) *TrustedBy {
	if local {
		return nil
	}
	tb := &TrustedBy{Default: string(trustpolicy.DefaultAllow), Rules: []PolicyRule{}}
	if p == nil {
		return tb
	}
	tb.Default, tb.Governed = string(p.Default()), p.Governed(td)
	tb.Rules = append(tb.Rules, byTD[td.Name()]...)
	return tb
}

// PolicyRules is, per trust domain a rule names, the rules naming
// it in policy order, each with its workloads, its peers there and what
// it matched (matches; nil leaves matched out): one pass over the rules however many trust domains the
// snapshot shows.
func PolicyRules(p *trustpolicy.Policy, matches func(rule string) (count uint64, recent []string)) map[string][]PolicyRule {
	if p == nil {
		return nil
	}
	out := make(map[string][]PolicyRule)
	for _, r := range p.Rules() {
		workloads := []string{}
		for _, s := range r.Workloads {
			workloads = append(workloads, SelectorString(s))
		}
		var matched *PolicyMatches
		if matches != nil {
			n, recent := matches(r.Name)
			matched = &PolicyMatches{Count: n, Recent: append([]string{}, recent...)}
		}
		for _, g := range r.TrustDomains {
			pr := PolicyRule{Name: r.Name, Origin: r.Origin, Workloads: slices.Clone(workloads), Peers: append([]string{}, g.Peers...), Matched: matched}
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

// LabelsNotLookedUp is an explanation's labels_note when the caller had
// no admin token: rules that select by labels then select nothing.
const LabelsNotLookedUp = "service account labels not looked up: ask with the admin token or on the admin socket; rules selecting by labels are explained as not selecting this workload"

// Explain is GET /v1/policy/explain: what sub would receive under p of
// tds, for people (the policy's own explanation in the snapshot's JSON
// names).
func Explain(p *trustpolicy.Policy, sub trustpolicy.Subject, tds []spiffeid.TrustDomain) Explanation {
	var d trustpolicy.Decision
	if p != nil {
		d = p.Decide(sub)
	}
	ex := trustpolicy.Explain(d, sub, tds)
	out := Explanation{
		SPIFFEID: sub.ID.String(), Namespace: sub.Namespace, ServiceAccount: sub.ServiceAccount,
		Default: string(ex.Default), Matched: []ExplainedMatch{}, TrustDomains: []ExplainedTrustDomain{},
	}
	if out.Default == "" {
		out.Default = string(trustpolicy.DefaultAllow)
	}
	for _, m := range ex.Matched {
		out.Matched = append(out.Matched, ExplainedMatch{Rule: m.Rule, Origin: m.Origin, Selector: m.Selector})
	}
	for _, t := range ex.TrustDomains {
		peers := append([]string{}, t.Peers...)
		out.TrustDomains = append(out.TrustDomains, ExplainedTrustDomain{TrustDomain: t.TrustDomain, Trusted: t.Trusted, Peers: peers, Because: t.Because})
	}
	return out
}
