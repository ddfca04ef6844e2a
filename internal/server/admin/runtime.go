package admin

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// runtimeRoutes mounts what an operator changes in this replica at run
// time: the log level and the bootstrap token file's reload. Each replica
// has its own, so followers take them too; both need the token or the
// admin socket.
func (h *Handler) runtimeRoutes() {
	if h.cfg.LogLevel != nil {
		h.mux.HandleFunc("GET /v1/log/level", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, api.LogLevel{Level: levelName(h.cfg.LogLevel.Level())}, true)
		})
		h.mux.HandleFunc("PUT /v1/log/level", h.replicaChange(h.serveSetLogLevel))
	}
	if h.cfg.ReloadTokens != nil {
		h.mux.HandleFunc("POST /v1/bootstrap-tokens/reload", h.replicaChange(h.serveReloadTokens))
	}
}

// replicaChange guards a change of this replica alone: no cross-site
// browser request, the admin token unless on the admin socket; any
// replica, leader or not.
func (h *Handler) replicaChange(next func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return refuseCrossSite(func(w http.ResponseWriter, r *http.Request) {
		if actor, ok := h.authenticate(w, r); ok {
			next(w, r, actor)
		}
	})
}

// levelName is a level as --log-level spells it.
func levelName(l slog.Level) string { return strings.ToLower(l.String()) }

// serveSetLogLevel sets the level of {"level": "debug"}, and records who
// changed it from what to what in the audit log.
func (h *Handler) serveSetLogLevel(w http.ResponseWriter, r *http.Request, actor string) {
	body, ok := readBody(w, r, 1<<10)
	if !ok {
		return
	}
	var req api.LogLevel
	var lvl slog.Level
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "log level: want {\"level\": \"debug\"}: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := lvl.UnmarshalText([]byte(req.Level)); err != nil {
		http.Error(w, fmt.Sprintf("log level %q: want debug, info, warn or error", req.Level), http.StatusBadRequest)
		return
	}
	prev := h.cfg.LogLevel.Level()
	h.cfg.LogLevel.Set(lvl)
	if h.cfg.Audit != nil && prev != lvl {
		h.cfg.Audit(audit.Entry{Event: "log_level_changed", TrustDomain: h.cfg.TrustDomain.Name(),
			Reason: fmt.Sprintf("log level %s to %s by %s (admin API)", levelName(prev), levelName(lvl), actor)})
	}
	writeJSON(w, api.LogLevel{Level: levelName(lvl), Previous: levelName(prev)}, true)
}

// serveReloadTokens re-reads --bootstrap-token-file; a file that does not
// load leaves the tokens in force and answers why. Either way the audit
// log records who asked and what came of it.
func (h *Handler) serveReloadTokens(w http.ResponseWriter, _ *http.Request, actor string) {
	r, err := h.cfg.ReloadTokens()
	if err != nil {
		h.auditReload(fmt.Sprintf("bootstrap token file not reloaded, by %s (admin API): %v; the tokens loaded before stay in force", actor, err))
		http.Error(w, err.Error()+"; the tokens loaded before stay in force", http.StatusUnprocessableEntity)
		return
	}
	h.auditReload(fmt.Sprintf("bootstrap token file reloaded by %s (admin API): %d added, %d removed, %d in force", actor, r.Added, r.Removed, r.Tokens))
	writeJSON(w, r, true)
}

func (h *Handler) auditReload(reason string) {
	if h.cfg.Audit != nil {
		h.cfg.Audit(audit.Entry{Event: "bootstrap_tokens_reloaded", TrustDomain: h.cfg.TrustDomain.Name(), Reason: reason})
	}
}
