package statusui

import (
	"fmt"
	"strings"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// policyPanel is the trust policy section: which local workloads may
// trust each federated trust domain, and by which rule.
type policyPanel struct {
	Default   string
	Rules     int
	Sources   []policySource
	Conflicts []string
	Rows      []policyRow
}

type policySource struct {
	Source, Detail string
	Failed         bool
}

// policyRow is one federated trust domain and who may trust it.
type policyRow struct {
	TrustDomain string
	// Who is the one-line answer; Class colours it (everyone, nobody,
	// some).
	Who, Class string
	Rules      []policyRuleRow
}

type policyRuleRow struct {
	Name, Origin string
	Workloads    string
	Peers        string // "every member" when not limited
	Matched      string // "" when not recorded
}

// policyPanelOf is the panel of s, nil when the server reports no trust
// policy state (it predates them).
func policyPanelOf(s api.Snapshot) *policyPanel {
	tp := s.TrustPolicy
	if tp == nil {
		return nil
	}
	p := &policyPanel{Default: tp.Default, Rules: tp.Rules, Conflicts: tp.Conflicts}
	for _, src := range tp.Sources {
		row := policySource{Source: src.Source, Detail: fmt.Sprintf("%d rules", src.Rules)}
		if src.LastError != "" {
			row.Failed, row.Detail = true, "last change refused, previous rules kept: "+src.LastError
		}
		p.Sources = append(p.Sources, row)
	}
	for _, td := range s.TrustDomains {
		if td.Local || td.TrustedBy == nil {
			continue
		}
		p.Rows = append(p.Rows, policyRowOf(td.Name, *td.TrustedBy))
	}
	return p
}

func policyRowOf(name string, tb api.TrustedBy) policyRow {
	row := policyRow{TrustDomain: name}
	switch {
	case tb.Everyone():
		row.Who, row.Class = "every workload (no rule names it; default allow)", "everyone"
	case !tb.Governed:
		row.Who, row.Class = "no workload (no rule names it; default deny)", "nobody"
	case len(tb.Rules) == 1:
		row.Who, row.Class = "workloads of 1 rule", "some"
	default:
		row.Who, row.Class = fmt.Sprintf("workloads of %d rules", len(tb.Rules)), "some"
	}
	for _, r := range tb.Rules {
		rr := policyRuleRow{Name: r.Name, Origin: r.Origin, Workloads: strings.Join(r.Workloads, " · "), Peers: "every member"}
		if len(r.Peers) > 0 {
			rr.Peers = strings.Join(r.Peers, " · ")
		}
		if m := r.Matched; m != nil {
			rr.Matched = fmt.Sprintf("%d workloads seen", m.Count)
			if len(m.Recent) > 0 {
				rr.Matched += ", recently " + strings.Join(m.Recent, ", ")
			}
		}
		row.Rules = append(row.Rules, rr)
	}
	return row
}
