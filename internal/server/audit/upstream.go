package audit

import (
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Finding codes of a local CA that runs under an upstream authority.
const (
	// CodeIntermediateShort: the active intermediate ends before the
	// longest workload certificate it may sign would, so leaves are cut
	// short (ca.SignX509SVID clamps them to its expiry).
	CodeIntermediateShort = "intermediate_expires_before_leaves"
	// CodeUpstreamUnreachable: the upstream has been failing for longer
	// than a set fraction of the intermediate's life.
	CodeUpstreamUnreachable = "upstream_unreachable"
	// CodeNoIntermediate: the CA has no valid intermediate and the
	// upstream fails to sign one (not up yet, or refusing): it signs
	// nothing.
	CodeNoIntermediate = "no_intermediate"
)

// DefaultUpstreamUnreachableFraction is the share of the intermediate's
// lifetime the upstream may fail for before an audit warns; past half of
// it, when the renewal was due, the finding is critical.
const DefaultUpstreamUnreachableFraction = 0.25

// Options tune the findings; the zero value takes the defaults.
type Options struct {
	// UpstreamUnreachableFraction, in (0, 1): see CodeUpstreamUnreachable.
	UpstreamUnreachableFraction float64
}

// CheckOptions refuses options out of range.
func CheckOptions(o Options) error {
	if f := o.UpstreamUnreachableFraction; f != 0 && (f <= 0 || f >= 1) {
		return fmt.Errorf("upstream unreachable fraction %v: want a number between 0 and 1 (exclusive)", f)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.UpstreamUnreachableFraction == 0 {
		o.UpstreamUnreachableFraction = DefaultUpstreamUnreachableFraction
	}
	return o
}

// isIntermediate says whether a local authority is the CA's own
// upstream-signed intermediate: it signs, but is no trust anchor, so the
// anchors' checks (expiry within weeks, shared roots) do not apply to it.
func isIntermediate(td api.TrustDomain, a api.Authority) bool {
	return td.Local && a.Upstream != ""
}

// upstreamFindings judges the local CA's active intermediate and the
// health of the upstream that signs it.
func upstreamFindings(s api.Snapshot, td api.TrustDomain, now time.Time, o Options) []api.Finding {
	if !td.Local || s.CA == nil {
		return nil
	}
	var out []api.Finding
	for _, a := range td.Authorities {
		if !isIntermediate(td, a) || a.State != "active" || a.NotAfter == nil || a.NotBefore == nil {
			continue
		}
		out = append(out, shortIntermediate(s.CA, td.Name, a, now)...)
		out = append(out, unreachableUpstream(s.CA.Upstream, td.Name, a, now, o.UpstreamUnreachableFraction)...)
	}
	return out
}

// noIntermediate is a critical finding when the local CA runs under an
// upstream that has failed since and no valid intermediate is active: at
// a first start whose upstream never answered, or after the last one
// expired. The local trust domain may have no entry at all then.
func noIntermediate(s api.Snapshot, now time.Time) []api.Finding {
	if s.CA == nil || s.CA.Upstream == nil || s.CA.Upstream.Failures == 0 {
		return nil
	}
	for _, td := range s.TrustDomains {
		for _, a := range td.Authorities {
			if isIntermediate(td, a) && a.State == "active" && a.NotAfter != nil && now.Before(*a.NotAfter) {
				return nil
			}
		}
	}
	up := s.CA.Upstream
	f := api.Finding{
		Severity: api.SeverityCritical, Code: CodeNoIntermediate, TrustDomain: s.TrustDomain,
		Message: fmt.Sprintf("the CA of %s has no valid intermediate and signs nothing: upstream %s has failed to sign one %d times%s (last: %s)",
			s.TrustDomain, up.Name, up.Failures, sinceText(up.FailingSince), up.LastError),
		Fix: "bring the upstream up and check --upstream-address; the CA asks again with backoff (5s doubling to 5m) and turns ready without a restart",
	}
	if up.Refused {
		f.Message += "; the upstream refused, which asking again does not mend"
		f.Fix = "mend what the error names (this server's place in the upstream's --downstream-allow, its --upstream-prov-cert, the CSR's approval or RBAC, the names the upstream's name constraints permit); the CA asks again every 5m and turns ready without a restart"
	}
	return []api.Finding{f}
}

// sinceText is " since T", or "" for an unknown time.
func sinceText(t *time.Time) string {
	if t == nil {
		return ""
	}
	return " since " + t.UTC().Format(time.RFC3339)
}

func shortIntermediate(st *api.CAStatus, td string, a api.Authority, now time.Time) []api.Finding {
	left := a.NotAfter.Sub(now)
	maxTTL := time.Duration(st.MaxWorkloadTTLSeconds) * time.Second
	if maxTTL <= 0 || left >= maxTTL {
		return nil
	}
	sev := api.SeverityWarning
	if def := time.Duration(st.WorkloadTTLSeconds) * time.Second; left < def || left <= 0 {
		sev = api.SeverityCritical
	}
	return []api.Finding{{
		Severity: sev, Code: CodeIntermediateShort, TrustDomain: td, Authority: a.SHA256,
		Message: fmt.Sprintf("the active intermediate of %s (signed by %s) expires in %s, %s, before the longest workload certificate it may sign (--max-workload-ttl %s) would: leaves are cut short to its expiry",
			td, a.Upstream, left.Round(time.Minute), a.NotAfter.UTC().Format(time.RFC3339), maxTTL),
		Fix: "ask the upstream for a longer intermediate (--upstream-ttl, and the upstream's own maximum, e.g. --max-downstream-ttl), or lower --max-workload-ttl to fit it; if renewals fail, see upstream_unreachable",
	}}
}

func unreachableUpstream(up *api.UpstreamStatus, td string, a api.Authority, now time.Time, fraction float64) []api.Finding {
	if up == nil || up.Failures == 0 {
		return nil
	}
	// The outage runs from its first failed request: renewals start at
	// half the intermediate's life, so the time since the last success
	// would call a minute's blip at renewal an outage of half a life.
	// Snapshots from servers that predate failing_since fall back to it.
	since := *a.NotBefore
	switch {
	case up.FailingSince != nil:
		since = *up.FailingSince
	case up.LastSuccess != nil:
		since = *up.LastSuccess
	}
	life := a.NotAfter.Sub(*a.NotBefore)
	down := now.Sub(since)
	if life <= 0 || down <= time.Duration(fraction*float64(life)) {
		return nil
	}
	sev := api.SeverityWarning
	if down > life/2 {
		sev = api.SeverityCritical
	}
	return []api.Finding{{
		Severity: sev, Code: CodeUpstreamUnreachable, TrustDomain: td, Authority: a.SHA256,
		Message: fmt.Sprintf("upstream %s has failed to sign an intermediate of %s for %s since %s (%.0f%% of the intermediate's %s life; %d failures, last: %s); the current intermediate expires %s",
			up.Name, td, down.Round(time.Minute), since.UTC().Format(time.RFC3339), 100*float64(down)/float64(life), life, up.Failures, up.LastError, a.NotAfter.UTC().Format(time.RFC3339)),
		Fix: "restore the upstream (its address, this server's credential and its place in the upstream's allow-list: see the last error); once the intermediate expires this CA signs nothing",
	}}
}
