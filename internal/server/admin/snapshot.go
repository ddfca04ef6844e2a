package admin

import (
	"cmp"
	"crypto"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

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
		RequireHSM: h.cfg.RequireHSM, CA: h.caStatus(),
	}
	store := h.cfg.Trust.Snapshot()
	statuses := h.federationStatuses()
	names := h.trustDomainNames(store, statuses)
	var policy *trustpolicy.Policy
	var byTD map[string][]api.PolicyRule
	if h.cfg.Policy != nil {
		policy, _ = h.cfg.Policy.Cell.Load()
		snap.TrustPolicy = policyView(h.cfg.Policy, policy)
		byTD = rulesByTrustDomain(h.cfg.Policy, policy)
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
			view.Authorities = bundleAuthorities(b, nil)
			view.Sequence = federation.SequenceOf(b)
		}
		if st, ok := statuses[n]; ok {
			view.Federation = federationView(st, h.origin(td))
			view.Sequence = st.Sequence
		}
		if h.cfg.Policy != nil {
			view.TrustedBy = trustedBy(policy, byTD, td, view.Local)
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
		a := api.X509Authority(r.Cert)
		a.State = string(r.State)
		if r.Upstream != nil {
			a.Upstream = r.Upstream.Name
		}
		a.KeyStorage = h.keyStorage(r.KeyRef)
		for _, t := range []time.Time{r.RetiredAt, r.ActivatedAt, r.PreparedAt} {
			if !t.IsZero() {
				u := t.UTC()
				a.Since = &u
				break
			}
		}
		seen[a.SHA256] = true
		out = append(out, a)
	}
	for _, a := range h.localJWTAuthorities(b) {
		seen[a.SHA256] = true
		out = append(out, a)
	}
	return append(out, bundleAuthorities(b, seen)...)
}

// bundleAuthorities describes b's authorities, skipping those in skip.
func bundleAuthorities(b *spiffebundle.Bundle, skip map[string]bool) []api.Authority {
	out := []api.Authority{}
	if b == nil {
		return out
	}
	for _, c := range b.X509Authorities() {
		if a := api.X509Authority(c); !skip[a.SHA256] {
			out = append(out, a)
		}
	}
	for _, set := range []struct {
		kind string
		keys map[string]crypto.PublicKey
	}{{api.KindJWT, b.JWTAuthorities()}, {api.KindWIT, b.WITAuthorities()}} {
		for _, kid := range slices.Sorted(maps.Keys(set.keys)) {
			if a := api.KeyAuthority(set.kind, kid, set.keys[kid]); !skip[a.SHA256] {
				out = append(out, a)
			}
		}
	}
	return out
}

func federationView(st federation.Status, origin string) *api.Federation {
	return &api.Federation{
		EndpointURL: st.EndpointURL, Profile: string(st.Profile), EndpointSPIFFEID: st.EndpointSPIFFEID,
		Origin: origin, State: string(st.State),
		LastAttempt: st.LastAttempt, LastSuccess: st.LastSuccess, NextRefresh: st.NextRefresh,
		LastError: st.LastError, ConsecutiveFailures: st.ConsecutiveFailures,
		RefreshHintSeconds: st.RefreshHintSeconds, Refusals: st.Refusals,
	}
}

// keyStorage is the snapshot's key_storage of one of our own keys: the
// key manager when the key has a reference there, else "state".
func (h *Handler) keyStorage(keyRef string) string {
	if keyRef == "" {
		return "state"
	}
	return cmp.Or(h.cfg.KeyManager, "key manager")
}

// caStatus is the snapshot's ca section: leaf lifetimes and, in upstream
// mode, the upstream's health; nil when the server gave no lifetimes.
func (h *Handler) caStatus() *api.CAStatus {
	if h.cfg.MaxWorkloadTTL <= 0 {
		return nil
	}
	st := &api.CAStatus{
		WorkloadTTLSeconds:    int64(h.cfg.WorkloadTTL / time.Second),
		MaxWorkloadTTLSeconds: int64(h.cfg.MaxWorkloadTTL / time.Second),
	}
	if h.cfg.Upstream == nil {
		return st
	}
	if up, ok := h.cfg.Upstream(); ok {
		st.Upstream = &api.UpstreamStatus{Name: up.Name, LastSuccess: utcOrNil(up.LastSuccess),
			LastError: up.LastError, LastErrorAt: utcOrNil(up.LastErrorAt), Failures: up.Failures,
			FailingSince: utcOrNil(up.FailingSince)}
	}
	return st
}

func utcOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
