package statusui

import (
	"bytes"
	"net/http"
	"strconv"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// ContentSecurityPolicy is sent with every page: inline styles only, no
// scripts, no fetches of any kind, no framing, no forms, no <base>.
const ContentSecurityPolicy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the status page for GET and HEAD; other methods get 405.
// It answers every path it is given, so mount it on exactly "/ui".
// snapshot is called once per request; findings (nil: the page says they
// were not evaluated) is called with that snapshot. A nil snapshot
// function is a programming error and panics.
func Handler(snapshot func() api.Snapshot, findings func(api.Snapshot) []api.Finding) http.Handler {
	if snapshot == nil {
		panic("statusui: nil snapshot function")
	}
	return &handler{snapshot: snapshot, findings: findings}
}

type handler struct {
	snapshot func() api.Snapshot
	findings func(api.Snapshot) []api.Finding
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("Referrer-Policy", "no-referrer")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	snap := h.snapshot()
	var fs []api.Finding
	if h.findings != nil {
		fs = h.findings(snap)
	}
	// Render fully before writing, so a failure is a clean 500 rather than
	// half a page.
	var buf bytes.Buffer
	if err := render(&buf, build(snap, fs, h.findings != nil)); err != nil {
		http.Error(w, "statusui: rendering the page failed", http.StatusInternalServerError)
		return
	}
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(buf.Bytes())
}
