package admin

import (
	"net/http"
	"time"
)

// issuerView is one OIDC or remote Kubernetes issuer in
// GET /v1/authn/issuers: what it is, and the state of its keys.
type issuerView struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Issuer string `json:"issuer"`
	// Keys is how many keys are held; 0 means its tokens are refused
	// (Unavailable) until a fetch succeeds.
	Keys        int        `json:"keys"`
	LastFetch   *time.Time `json:"last_fetch,omitempty"`
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// LastError is the last fetch's error, "" when it succeeded.
	LastError string `json:"last_error,omitempty"`
}

func (h *Handler) serveIssuers(w http.ResponseWriter, _ *http.Request) {
	out := []issuerView{}
	for _, s := range h.cfg.Issuers() {
		out = append(out, issuerView{
			Name: s.Name, Kind: string(s.Kind), Issuer: s.Issuer, Keys: s.Keys,
			LastFetch: optTime(s.LastFetch), LastSuccess: optTime(s.LastSuccess), LastError: s.LastError,
		})
	}
	writeJSON(w, struct {
		Issuers []issuerView `json:"issuers"`
	}{out}, true)
}
