package bundleserver

import (
	"io"
	"net/http"

	"github.com/gorilla/mux"
)

// retryAfter is sent with 503 while the local bundle is not available. A
// CA has its bundle within milliseconds of starting, so this is short.
const retryAfter = "10"

// Header values shared by every response. Handlers assign these slices to
// the header map directly: no canonicalisation, no allocation. net/http
// never modifies them, and an append by a wrapper would copy.
var (
	jsonHdr    = []string{"application/json"}
	textHdr    = []string{"text/plain; charset=utf-8"}
	nosniffHdr = []string{"nosniff"}
	noStoreHdr = []string{"no-store"}
	allowHdr   = []string{"GET, HEAD"}
	retryHdr   = []string{retryAfter}
)

func (s *Server) newRouter() http.Handler {
	r := mux.NewRouter()
	// An unclean path is a 404 like any other unknown path, rather than
	// mux's permanent redirect, which peers must not follow (§7.5.1).
	r.SkipClean(true)
	r.Path(BundlesPrefix + "{trustDomain}").HandlerFunc(s.serveByName)
	r.Path(BundleMapPath).HandlerFunc(s.serveMap)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.fail(w, routeNone, http.StatusNotFound, "404 not found\n")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// Peers poll the local bundle; it is nearly all the traffic. Going
		// around mux's regexp match and its two request clones is worth
		// about 4% of a whole HTTPS request (BenchmarkInterleaved). mux
		// would match Path literally too (checkPath keeps it literal).
		if req.URL.Path == s.cfg.Path {
			s.serveLocal(w, req)
			return
		}
		if ir, ok := s.issuerRoutes[req.URL.Path]; ok {
			s.serveIssuer(w, req, ir)
			return
		}
		r.ServeHTTP(w, req)
	})
}

func (s *Server) serveLocal(w http.ResponseWriter, r *http.Request) {
	if s.methodAllowed(w, r, routeLocal) {
		s.serveDoc(w, r, routeLocal, s.snap.Load().local)
	}
}

func (s *Server) serveMap(w http.ResponseWriter, r *http.Request) {
	if s.methodAllowed(w, r, routeMap) {
		s.serveDoc(w, r, routeMap, s.snap.Load().bundleMap)
	}
}

// serveByName serves any bundle held. The index holds only names that
// passed bundledoc.TrustDomainName, so an invalid name is simply unknown.
func (s *Server) serveByName(w http.ResponseWriter, r *http.Request) {
	if !s.methodAllowed(w, r, routeByName) {
		return
	}
	name := mux.Vars(r)["trustDomain"]
	if doc := s.snap.Load().byName[name]; doc != nil || name == s.localName {
		s.serveDoc(w, r, routeByName, doc)
		return
	}
	s.fail(w, routeByName, http.StatusNotFound, "404 no bundle for this trust domain\n")
}

func (s *Server) methodAllowed(w http.ResponseWriter, r *http.Request, route int) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header()["Allow"] = allowHdr
	s.fail(w, route, http.StatusMethodNotAllowed, "405 method not allowed\n")
	return false
}

// serveDoc writes doc, or 503 when it is nil. The error bodies are plain
// text on purpose: go-spiffe's FetchBundle ignores the status code, so an
// error body that parsed as a bundle could replace a peer's good one.
func (s *Server) serveDoc(w http.ResponseWriter, r *http.Request, route int, doc *document) {
	h := w.Header()
	if doc == nil {
		h["Retry-After"] = retryHdr
		s.fail(w, route, http.StatusServiceUnavailable, "503 bundle not available yet\n")
		return
	}
	s.fetched(r, route, doc)
	h["Etag"] = doc.etagHdr
	h["Cache-Control"] = doc.cacheCtrlHdr
	h["X-Content-Type-Options"] = nosniffHdr
	if inm, ok := r.Header["If-None-Match"]; ok && noneMatch(inm, doc.etag) {
		w.WriteHeader(http.StatusNotModified)
		s.metrics.served(route, http.StatusNotModified)
		return
	}
	h["Content-Type"] = jsonHdr
	h["Content-Length"] = doc.lengthHdr
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(doc.body)
	}
	s.metrics.served(route, http.StatusOK)
}

func (s *Server) fail(w http.ResponseWriter, route, code int, msg string) {
	h := w.Header()
	h["Content-Type"] = textHdr
	h["Cache-Control"] = noStoreHdr
	h["X-Content-Type-Options"] = nosniffHdr
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg)
	s.metrics.served(route, code)
}
