package identitymap

import (
	"errors"
	"fmt"
	"strings"
)

// Reasons of Explanation.Because other than the rules.
const (
	BecauseDefault  = "default istio: no rule selects this workload"
	BecauseNoMatch  = "no identity: no rule selects this workload and the default gives it none"
	BecauseConflict = "conflict: rules that select this workload give it different SPIFFE IDs"
	BecauseFacts    = "no identity: the workload's facts do not fill a template"
)

// Explanation is what `trustbridge policy explain` and the status pages
// print for one workload: which rules selected it, by which selector and
// facts, what each made of it, and the identity or why there is none.
type Explanation struct {
	Workload Workload `json:"workload"`
	Default  Default  `json:"default"`
	// Rules is how many rules were considered.
	Rules   int           `json:"rules"`
	Matched []MatchResult `json:"matched"`
	// SPIFFEID, TTL (a Go duration, "" for the issuer's) and DNSNames are
	// the identity; SPIFFEID is "" when there is none.
	SPIFFEID string   `json:"spiffeID,omitempty"`
	TTL      string   `json:"ttl,omitempty"`
	DNSNames []string `json:"dnsNames,omitempty"`
	// Because is "rule <name> (<origin>)" (or "rules a (...), b (...)"),
	// or one of the Because constants.
	Because string `json:"because"`
	// Error is Identify's error, "" when there is an identity.
	Error string `json:"error,omitempty"`
}

// MatchResult is one rule that selected the workload.
type MatchResult struct {
	Rule   string `json:"rule"`
	Origin string `json:"origin"`
	// Selector is the index of the first of the rule's selectors that
	// matched, Fields the facts it checked.
	Selector int      `json:"selector"`
	Fields   []string `json:"fields"`
	// SPIFFEID and DNSNames are what the rule made of the workload; Error
	// says why it could not.
	SPIFFEID string   `json:"spiffeID,omitempty"`
	DNSNames []string `json:"dnsNames,omitempty"`
	Error    string   `json:"error,omitempty"`
}

// Explain explains Identify(w): it evaluates w the same way.
func (m *Map) Explain(w Workload) Explanation {
	if m == nil {
		_, err := m.Identify(w)
		return Explanation{Workload: w, Matched: []MatchResult{}, Because: BecauseNoMatch, Error: err.Error()}
	}
	res := m.evaluate(&w)
	e := Explanation{Workload: w, Default: m.cfg.Default, Rules: len(m.rules), Matched: make([]MatchResult, 0, len(res.matched))}
	for _, rr := range res.matched {
		mr := MatchResult{Rule: rr.rule.Name, Origin: rr.rule.Origin, Selector: rr.selector, Fields: rr.rule.selectors[rr.selector].fields()}
		if rr.err != nil {
			mr.Error = rr.err.Error()
		} else {
			mr.SPIFFEID, mr.DNSNames = rr.id.String(), rr.dns
		}
		e.Matched = append(e.Matched, mr)
	}
	if res.err != nil {
		e.Error = res.err.Error()
		e.Because = because(res.err)
		return e
	}
	e.SPIFFEID, e.DNSNames = res.identity.ID.String(), res.identity.DNSNames
	if res.identity.TTL > 0 {
		e.TTL = res.identity.TTL.String()
	}
	e.Because = BecauseDefault
	if len(e.Matched) > 0 {
		e.Because = rulesText(e.Matched)
	}
	return e
}

func because(err error) string {
	switch {
	case errors.Is(err, ErrConflict):
		return BecauseConflict
	case errors.Is(err, ErrFacts):
		return BecauseFacts
	}
	return BecauseNoMatch
}

// rulesText is "rule a (origin)" or "rules a (origin), b (origin)".
func rulesText(matched []MatchResult) string {
	parts := make([]string, len(matched))
	for i, m := range matched {
		parts[i] = fmt.Sprintf("%s (%s)", m.Rule, m.Origin)
	}
	if len(parts) == 1 {
		return "rule " + parts[0]
	}
	return "rules " + strings.Join(parts, ", ")
}
