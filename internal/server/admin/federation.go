package admin

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

func (h *Handler) serveFederation(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, h.federationList(), true)
}

// federationList is every trust domain whose bundle the server holds
// besides its own, sorted by name: those polled, with their status and
// where they are configured, and those held as set (bundle set, a bundle
// file), read from the trust store every consumer reads.
func (h *Handler) federationList() []api.FederationStatus {
	out := []api.FederationStatus{}
	polled := map[string]bool{}
	for _, st := range h.federationStatuses() {
		td, err := spiffeid.TrustDomainFromString(st.TrustDomain)
		if err != nil {
			continue
		}
		out = append(out, api.NewFederationStatus(st, h.origin(td)))
		polled[st.TrustDomain] = true
	}
	if h.cfg.Trust == nil {
		return out
	}
	published := h.cfg.Trust.Published()
	for _, td := range h.cfg.Trust.Snapshot().TrustDomains() {
		if td == h.cfg.TrustDomain || polled[td.Name()] {
			continue
		}
		for _, src := range h.cfg.Trust.Sources(td) {
			origin, ok := heldOrigin(src)
			b, held := published.Bundle(td, src)
			if ok && held {
				out = append(out, api.NewHeldStatus(b, origin))
			}
		}
	}
	slices.SortStableFunc(out, func(a, b api.FederationStatus) int { return cmp.Compare(a.TrustDomain, b.TrustDomain) })
	return out
}

// heldOrigin is the origin of a bundle held as set by the trust-store
// source named source: bundle set's (named api.OriginStatic) or a bundle
// file's ("file:<path>"); false for a source that is polled or ours.
func heldOrigin(source string) (string, bool) {
	if source == api.OriginStatic {
		return api.OriginStatic, true
	}
	if path, ok := strings.CutPrefix(source, "file:"); ok {
		return api.OriginBundleFile + ":" + path, true
	}
	return "", false
}

func (h *Handler) serveRefresh(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("trust_domain")
	td, err := bundledoc.ParseTrustDomain(name)
	if err != nil {
		http.Error(w, fmt.Sprintf("trust_domain %q: %v", name, err), http.StatusBadRequest)
		return
	}
	fed := h.cfg.Federation
	if fed == nil {
		http.Error(w, "no federation is configured", http.StatusNotFound)
		return
	}
	if !h.isLeader() {
		http.Error(w, "this replica is not the leader; only the leader polls federated endpoints (ask the leader, see the trustbridge_leader metric)", http.StatusConflict)
		return
	}
	federated := false
	for _, st := range fed.Status() {
		federated = federated || st.TrustDomain == td.Name()
	}
	if !federated {
		http.Error(w, fmt.Sprintf("trust domain %q is not federated", td.Name()), http.StatusNotFound)
		return
	}
	if !h.refresh.allow() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "one refresh a second; try again", http.StatusTooManyRequests)
		return
	}
	if err := fed.Refresh(r.Context(), td); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	_, _ = io.WriteString(w, "refreshed "+td.Name()+"\n")
}

// refuseCrossSite guards a state-changing handler: browsers send Origin
// on cross-site POSTs, and a web page the operator visits must not be able
// to drive the server. The CLI sends neither header.
func refuseCrossSite(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if site := r.Header.Get("Sec-Fetch-Site"); r.Header.Get("Origin") != "" || (site != "" && site != "none") {
			http.Error(w, "cross-site requests are refused", http.StatusForbidden)
			return
		}
		next(w, r)
	}
}

// rateLimit allows one operator refresh a second: each is a real fetch.
type rateLimit struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	last  time.Time
}

func (l *rateLimit) allow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clock.Since(l.last) < time.Second {
		return false
	}
	l.last = l.clock.Now()
	return true
}
