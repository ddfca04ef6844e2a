package admin

import (
	"net/http"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

func (h *Handler) serveIssuers(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, api.NewIssuers(h.cfg.Issuers()), true)
}
