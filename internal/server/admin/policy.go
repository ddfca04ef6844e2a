package admin

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/server/api"
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
			note = api.LabelsNotLookedUp
		}
	}
	ex := api.Explain(p, sub, h.trustDomains())
	ex.LabelsNote = note
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, ex, true)
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
