package admin

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// serveFetchers is GET /v1/bundle/fetchers: who fetched our bundle, when
// last and at which sequence, sorted by client. Read-only and public as
// /v1/trust is: addresses and user agents, no secret. A server without a
// bundle endpoint (no Config.Fetchers) answers 404 saying so.
func (h *Handler) serveFetchers(w http.ResponseWriter, _ *http.Request) {
	if h.cfg.Fetchers == nil {
		http.Error(w, "this server has no bundle endpoint (--bundle-listen): nobody fetches its bundle from it, so there are no fetchers to list", http.StatusNotFound)
		return
	}
	out := api.BundleFetchers{TrustDomain: h.cfg.TrustDomain.Name(), Fetchers: slices.Clone(h.cfg.Fetchers())}
	if out.Fetchers == nil {
		out.Fetchers = []api.BundleFetcher{}
	}
	slices.SortFunc(out.Fetchers, func(a, b api.BundleFetcher) int { return cmp.Compare(a.Client, b.Client) })
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, out, true)
}
