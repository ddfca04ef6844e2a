package trustpolicy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Reasons of ExplainedTrustDomain.Because other than the rules.
const (
	BecauseLocal        = "local trust domain"
	BecauseDefaultAllow = "default allow"
	BecauseDefaultDeny  = "default deny"
	BecauseNoPolicy     = "default allow (no trust policy)"
	BecauseGoverned     = "governed: no rule selecting this workload grants it"
)

// Explanation is what `trustbridge policy explain` prints: for every trust
// domain the server trusts, whether the subject receives it, with which
// peers, and which rule (or the default) decided.
type Explanation struct {
	Subject        string            `json:"subject"`
	Namespace      string            `json:"namespace,omitempty"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// Policy is false when no policy is in force (everything trusted).
	Policy       bool                   `json:"policy"`
	Default      Default                `json:"default"`
	Matched      []Match                `json:"matched"`
	TrustDomains []ExplainedTrustDomain `json:"trustDomains"`
}

// ExplainedTrustDomain is one trust domain of an Explanation.
type ExplainedTrustDomain struct {
	TrustDomain string   `json:"trustDomain"`
	Trusted     bool     `json:"trusted"`
	Peers       []string `json:"peers,omitempty"` // empty: every member
	// Because is "rule <name> (<origin>)" (or "rules a (...), b (...)"),
	// or one of the Because constants.
	Because string `json:"because"`
}

// Explain explains d, the decision for sub, for the given trust domains
// (those the server trusts), in their order.
func Explain(d Decision, sub Subject, tds []spiffeid.TrustDomain) Explanation {
	e := Explanation{
		Subject:        sub.ID.String(),
		Namespace:      sub.Namespace,
		ServiceAccount: sub.ServiceAccount,
		Labels:         sub.Labels,
		Policy:         d.policy != nil,
		Default:        DefaultAllow,
		Matched:        slices.Clone(d.Matched),
		TrustDomains:   make([]ExplainedTrustDomain, 0, len(tds)),
	}
	if e.Matched == nil {
		e.Matched = []Match{}
	}
	if d.policy != nil {
		e.Default = d.policy.def
	}
	for _, td := range tds {
		e.TrustDomains = append(e.TrustDomains, explainOne(d, td))
	}
	return e
}

func explainOne(d Decision, td spiffeid.TrustDomain) ExplainedTrustDomain {
	grant, ok := d.Allows(td)
	out := ExplainedTrustDomain{TrustDomain: td.Name(), Trusted: ok}
	for _, p := range grant.Peers {
		out.Peers = append(out.Peers, p.String())
	}
	switch {
	case d.policy == nil:
		out.Because = BecauseNoPolicy
	case td == d.policy.local:
		out.Because = BecauseLocal
	case len(grant.Rules) > 0:
		out.Because = d.rulesText(grant.Rules)
	case d.policy.governed[td]:
		out.Because = BecauseGoverned
	case d.policy.def == DefaultAllow:
		out.Because = BecauseDefaultAllow
	default:
		out.Because = BecauseDefaultDeny
	}
	return out
}

// rulesText is "rule a (origin)" or "rules a (origin), b (origin)".
func (d Decision) rulesText(rules []string) string {
	parts := make([]string, len(rules))
	for i, name := range rules {
		parts[i] = name
		if j := slices.IndexFunc(d.Matched, func(m Match) bool { return m.Rule == name }); j >= 0 {
			parts[i] = fmt.Sprintf("%s (%s)", name, d.Matched[j].Origin)
		}
	}
	if len(parts) == 1 {
		return "rule " + parts[0]
	}
	return "rules " + strings.Join(parts, ", ")
}
