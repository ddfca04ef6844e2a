package bundleserver

import "net/http"

// NewHTTPServer exposes the hardened server settings so benchmarks run
// their baselines on exactly what Serve runs.
func (s *Server) NewHTTPServer(h http.Handler) *http.Server { return s.httpServer(h) }

// LocalDocument is the rendered local document, compared by identity to
// show that an Update rendered nothing new.
func (s *Server) LocalDocument() any { return s.snap.Load().local }

// DisableFetchers stops s recording its fetchers, as the handler was
// before the record: the baseline of BenchmarkFetchers. Call it before
// serving.
func (s *Server) DisableFetchers() { s.fetchers = nil }
