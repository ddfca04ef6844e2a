package admin

import (
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// IdentityMapConfig is the identity map node agents are checked against,
// as the admin API shows (/v1/snapshot's identity_map) and explains it
// (GET /v1/identity/explain).
type IdentityMapConfig struct {
	// Map is the map in force (identitymap.Combiner.Map). Required.
	Map func() *identitymap.Map
	// Statuses reports each source; nil: none.
	Statuses func() []identitymap.Status
}

// maxExplainLabels bounds the labels of one explain request.
const maxExplainLabels = 64

// identityNote says what the server's explanation cannot know.
const identityNote = "the server knows a pod's namespace, service account, name, UID, labels and node; rules that need unix facts or the container are evaluated by node agents only, and the server never grants their IDs"

func (h *Handler) identityMap() *api.IdentityMap {
	var sources []identitymap.Status
	if h.cfg.IdentityMap.Statuses != nil {
		sources = h.cfg.IdentityMap.Statuses()
	}
	return api.NewIdentityMap(sources, h.cfg.IdentityMap.Map())
}

// serveIdentityExplain answers GET /v1/identity/explain?namespace=N
// &service_account=S[&pod_name=P&pod_uid=U&node_name=N&label=k=v...]:
// which identity the identity map gives a pod with these facts, as the
// server decides a node agent's request for it, and why. The facts are
// the caller's: nothing is looked up.
func (h *Handler) serveIdentityExplain(w http.ResponseWriter, r *http.Request) {
	wl, err := explainWorkload(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ex := api.ExplainIdentity(h.cfg.IdentityMap.Map(), wl)
	ex.Note = identityNote
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, ex, true)
}

// explainWorkload reads a pod's facts from the query.
func explainWorkload(r *http.Request) (identitymap.Workload, error) {
	q := r.URL.Query()
	for k, vs := range q {
		for _, v := range vs {
			if len(v) > maxExplainParam {
				return identitymap.Workload{}, fmt.Errorf("%s: longer than 2048 bytes", k)
			}
		}
	}
	if q.Get("namespace") == "" || q.Get("service_account") == "" {
		return identitymap.Workload{}, fmt.Errorf("namespace and service_account are required: the pod's facts as the API server has them")
	}
	labels := map[string]string{}
	if len(q["label"]) > maxExplainLabels {
		return identitymap.Workload{}, fmt.Errorf("label: more than %d", maxExplainLabels)
	}
	for _, kv := range q["label"] {
		k, v, ok := strings.Cut(kv, "=")
		if errs := validation.IsQualifiedName(k); !ok || len(errs) > 0 {
			return identitymap.Workload{}, fmt.Errorf("label %q: want key=value with a valid label key", kv)
		}
		labels[k] = v
	}
	return identitymap.ServerFacts(q.Get("namespace"), q.Get("service_account"), q.Get("pod_name"), q.Get("pod_uid"), q.Get("node_name"), labels), nil
}
