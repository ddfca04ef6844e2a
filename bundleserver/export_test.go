package bundleserver

import "net/http"

// NewHTTPServer exposes the hardened server settings so benchmarks run
// their baselines on exactly what Serve runs.
func (s *Server) NewHTTPServer(h http.Handler) *http.Server { return s.httpServer(h) }

// DisableFetchers stops s recording its fetchers, as the handler was
// before the record: the baseline of BenchmarkFetchers. Call it before
// serving.
func (s *Server) DisableFetchers() { s.fetchers = nil }
