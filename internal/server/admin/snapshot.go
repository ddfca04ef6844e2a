package admin

import (
	"cmp"
	"net/http"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// serveSnapshot answers GET /v1/snapshot, indented unless ?compact.
func (h *Handler) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, h.Snapshot(), !strings.Contains(r.URL.RawQuery, "compact"))
}

// Snapshot is what /v1/snapshot, `trustbridge audit` and /ui show: every
// trust domain the server trusts, by which authorities, since when and
// from where. It needs Config.Trust.
func (h *Handler) Snapshot() api.Snapshot {
	snap := api.Snapshot{
		Time: h.cfg.Clock.Now().UTC(), TrustDomain: h.cfg.TrustDomain.Name(), Actor: h.cfg.Actor, Leader: h.isLeader(),
		RequireHSM: h.cfg.RequireHSM, CA: h.caStatus(), OIDCIssuers: h.oidcIssuers(),
	}
	if h.cfg.ClusterTrustBundles != nil {
		snap.ClusterTrustBundles = h.cfg.ClusterTrustBundles()
	}
	store := h.cfg.Trust.Snapshot()
	statuses := h.federationStatuses()
	names := h.trustDomainNames(store, statuses)
	var policy *trustpolicy.Policy
	var byTD map[string][]api.PolicyRule
	if h.cfg.Policy != nil {
		policy, _ = h.cfg.Policy.Cell.Load()
		snap.TrustPolicy = api.NewTrustPolicy(h.policySources(), policy)
		byTD = api.PolicyRules(policy, h.cfg.Policy.Matches)
	}
	if h.cfg.IdentityMap != nil {
		snap.IdentityMap = h.identityMap()
	}
	for n := range names {
		td, err := spiffeid.TrustDomainFromString(n)
		if err != nil {
			continue
		}
		view := api.TrustDomain{Name: n, Local: td == h.cfg.TrustDomain, Sources: h.cfg.Trust.Sources(td), Authorities: []api.Authority{}}
		if view.Sources == nil {
			view.Sources = []string{}
		}
		b, _ := store.Bundle(td)
		if view.Local {
			seq := h.cfg.CA.Sequence()
			view.Sequence = &seq
			view.Authorities = h.localAuthorities(b)
			view.JWTIssuer = jwtIssuer(view.Authorities)
		} else {
			view.Authorities = api.BundleAuthorities(b, nil)
			view.Sequence = federation.SequenceOf(b)
		}
		if st, ok := statuses[n]; ok {
			view.Federation = api.NewFederation(st, h.origin(td))
			view.Sequence = st.Sequence
		}
		if h.cfg.Policy != nil {
			view.TrustedBy = api.NewTrustedBy(policy, byTD, td, view.Local)
		}
		snap.TrustDomains = append(snap.TrustDomains, view)
	}
	slices.SortFunc(snap.TrustDomains, localFirst)
	return snap
}

// federationStatuses are the federation's statuses by trust domain name.
func (h *Handler) federationStatuses() map[string]federation.Status {
	statuses := map[string]federation.Status{}
	if h.cfg.Federation != nil {
		for _, st := range h.cfg.Federation.Status() {
			statuses[st.TrustDomain] = st
		}
	}
	return statuses
}

// trustDomainNames are the trust domains the snapshot shows: the local
// one, those in the trust store and those federated (fetched or not).
func (h *Handler) trustDomainNames(store *trust.Snapshot, statuses map[string]federation.Status) map[string]bool {
	names := map[string]bool{h.cfg.TrustDomain.Name(): true}
	for _, td := range store.TrustDomains() {
		names[td.Name()] = true
	}
	for n := range statuses {
		names[n] = true
	}
	return names
}

// localFirst orders the local trust domain first, then by name.
func localFirst(a, b api.TrustDomain) int {
	if a.Local != b.Local {
		if a.Local {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.Name, b.Name)
}

func (h *Handler) origin(td spiffeid.TrustDomain) string {
	if h.cfg.Origin == nil {
		return ""
	}
	return h.cfg.Origin(td)
}

// localAuthorities are the CA's roots with their rotation state, then any
// other authority trusted for the local trust domain (a bundle file).
func (h *Handler) localAuthorities(b *spiffebundle.Bundle) []api.Authority {
	out := []api.Authority{}
	seen := map[string]bool{}
	for _, r := range h.cfg.CA.Roots() {
		a := api.RootAuthority(r, h.cfg.KeyManager)
		seen[a.SHA256] = true
		out = append(out, a)
	}
	for _, a := range h.localJWTAuthorities(b) {
		seen[a.SHA256] = true
		out = append(out, a)
	}
	return append(out, api.BundleAuthorities(b, seen)...)
}

// caStatus is the snapshot's ca section; nil when the server gave no
// lifetimes.
func (h *Handler) caStatus() *api.CAStatus {
	if h.cfg.MaxWorkloadTTL <= 0 {
		return nil
	}
	var up *ca.UpstreamStatus
	if h.cfg.Upstream != nil {
		if st, ok := h.cfg.Upstream(); ok {
			up = &st
		}
	}
	return api.NewCAStatus(h.cfg.WorkloadTTL, h.cfg.MaxWorkloadTTL, up)
}

// policySources are what each trust policy source last did; nil: none.
func (h *Handler) policySources() []trustpolicy.Status {
	if h.cfg.Policy.Statuses == nil {
		return nil
	}
	return h.cfg.Policy.Statuses()
}
