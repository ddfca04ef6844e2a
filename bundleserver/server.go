package bundleserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Routes besides Config.Path.
const (
	BundlesPrefix = "/bundles/"
	BundleMapPath = "/bundle-map"
)

// Defaults applied by New.
const (
	DefaultPath                 = "/"
	DefaultReadHeaderTimeout    = 5 * time.Second
	DefaultReadTimeout          = 10 * time.Second
	DefaultWriteTimeout         = 10 * time.Second
	DefaultIdleTimeout          = 10 * time.Second // peers fetch minutes apart; a kept connection is memory held for nothing
	DefaultShutdownTimeout      = 10 * time.Second
	DefaultMaxConcurrentStreams = 100
	// MaxHeaderBytes bounds request headers; a bundle request needs a few
	// hundred bytes.
	MaxHeaderBytes = 8 << 10
)

// Config configures a Server. TrustDomain and Local are required.
type Config struct {
	// TrustDomain is the local trust domain, whose bundle Local provides.
	TrustDomain spiffeid.TrustDomain
	Local       Source
	// Path serves the local bundle; default "/". It must not be, or be
	// under, the fixed routes /bundle-map and /bundles/.
	Path string
	// RefreshHint is written into the local document when the local
	// bundle has no spiffe_refresh_hint of its own (a bundle file from an
	// offline CA, say). Zero leaves such a document without one. The CA
	// sets the hint itself; this never overrides a bundle's hint.
	RefreshHint time.Duration

	// Others returns the other bundles the server holds (federated peers,
	// bundle files), each immutable. They are served at
	// /bundles/{trustDomain} and in /bundle-map only when ServeOthers is
	// set; otherwise those routes carry the local bundle alone. An entry
	// for the local trust domain is ignored: Local is authoritative.
	Others      func() []*spiffebundle.Bundle
	ServeOthers bool
	// revocationsOf gives the revoked-authority entries to serve with one
	// of Others' bundles (a relayed file's); nil, or no entries, serves
	// none. Endpoint sets it.
	revocationsOf func(*spiffebundle.Bundle) []bundledoc.Revocation

	// Issuers are OIDC issuers published beside the bundles (oidc.go):
	// each one's discovery document and JWKS under its URL's path.
	Issuers []Issuer

	// AllowEmpty lets the local bundle be served with no keys. Peers read
	// "keys": [] as the revocation of every key, so by default such a
	// bundle is refused and the last good document stays served.
	AllowEmpty bool

	// GetCertificate supplies the serving certificate at each handshake, so
	// rotating it needs no restart. Required by Serve: an X509-SVID for
	// https_spiffe or a Web PKI certificate for https_web.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// NextProtos are ALPN protocols offered besides "h2" and "http/1.1":
	// acme.ALPNProto ("acme-tls/1") when ACME validates with TLS-ALPN-01
	// on this listener.
	NextProtos []string

	Timeouts Timeouts
	// MaxConcurrentStreams limits HTTP/2 streams per connection; default
	// DefaultMaxConcurrentStreams.
	MaxConcurrentStreams int

	Logger     *slog.Logger          // nil discards
	Registerer prometheus.Registerer // nil: a private registry
	Clock      clock.PassiveClock    // nil: the real clock; stamps Fetchers
}

// Timeouts of the HTTP server; zero fields take the defaults.
type Timeouts struct {
	ReadHeader time.Duration // DefaultReadHeaderTimeout; also bounds the TLS handshake
	Read       time.Duration // DefaultReadTimeout
	Write      time.Duration // DefaultWriteTimeout
	Idle       time.Duration // DefaultIdleTimeout
	Shutdown   time.Duration // DefaultShutdownTimeout: graceful shutdown, then connections are closed
}

func (t *Timeouts) setDefaults() error {
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"read header", &t.ReadHeader, DefaultReadHeaderTimeout},
		{"read", &t.Read, DefaultReadTimeout},
		{"write", &t.Write, DefaultWriteTimeout},
		{"idle", &t.Idle, DefaultIdleTimeout},
		{"shutdown", &t.Shutdown, DefaultShutdownTimeout},
	} {
		if *f.v < 0 {
			return fmt.Errorf("%s timeout %s is negative", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return nil
}

// Server serves SPIFFE bundle endpoints. Documents are rendered once per
// bundle change, in Update, and every request writes the same bytes.
type Server struct {
	cfg       Config
	localName string
	logger    *slog.Logger
	metrics   *metrics
	fetchers  *fetchers
	handler   http.Handler
	// issuerRoutes are the issuers' documents' paths, fixed in New.
	issuerRoutes map[string]issuerRoute

	// snap is what requests read: one atomic load gives a consistent view
	// of every route.
	snap atomic.Pointer[snapshot]

	mu sync.Mutex // serialises Update; guards refused
	// refused holds, per trust domain, the last bundle refused and why, so
	// a bad bundle that stays is neither re-rendered nor logged again.
	refused map[string]refusal
}

type refusal struct {
	src  *spiffebundle.Bundle
	revs []bundledoc.Revocation
	err  error
}

// snapshot is an immutable view of everything served.
type snapshot struct {
	local  *document            // nil: 503 until a bundle is available
	byName map[string]*document // local (when available) and, with ServeOthers, the others
	// bundleMap renders mapMembers (sorted by name); nil while local is.
	bundleMap  *document
	mapMembers []*document
	// issuers are Config.Issuers' documents, in their order.
	issuers []issuerDocs
}

// New validates cfg, applies defaults and renders the documents once.
// It starts no goroutines.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("bundleserver: %w", err)
	}
	routes, err := cfg.checkIssuers()
	if err != nil {
		return nil, fmt.Errorf("bundleserver: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("bundleserver: register metrics: %w", err)
	}
	f, err := newFetchers(cfg.Registerer, cfg.Clock)
	if err != nil {
		return nil, fmt.Errorf("bundleserver: register metrics: %w", err)
	}
	s := &Server{
		cfg:       cfg,
		localName: cfg.TrustDomain.Name(),
		logger:    cfg.Logger.With(logattr.Component, "bundleserver"),
		metrics:   m,
		fetchers:  f,
		refused:   map[string]refusal{},

		issuerRoutes: routes,
	}
	s.snap.Store(&snapshot{byName: map[string]*document{}})
	s.handler = s.newRouter()
	_ = s.Update() // logged; an unavailable bundle is served as 503
	return s, nil
}

func (c *Config) setDefaults() error {
	if c.TrustDomain.IsZero() {
		return errors.New("trust domain is required")
	}
	if _, err := bundledoc.TrustDomainName(c.TrustDomain.Name()); err != nil {
		return fmt.Errorf("trust domain %q: %w", c.TrustDomain.Name(), err)
	}
	if c.Local == nil {
		return errors.New("local bundle source is required")
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if err := checkPath(c.Path); err != nil {
		return fmt.Errorf("path %q: %w", c.Path, err)
	}
	if c.RefreshHint < 0 {
		return fmt.Errorf("refresh hint %s is negative", c.RefreshHint)
	}
	if err := c.Timeouts.setDefaults(); err != nil {
		return err
	}
	if c.MaxConcurrentStreams < 0 {
		return fmt.Errorf("max concurrent streams %d is negative", c.MaxConcurrentStreams)
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return nil
}

// checkPath accepts a clean absolute path (a trailing slash allowed) that
// the router takes literally and that no fixed route claims.
func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return errors.New(`must start with "/"`)
	}
	if i := strings.IndexFunc(p, func(r rune) bool {
		return r <= ' ' || r == 0x7f || strings.ContainsRune("?#{}%", r)
	}); i >= 0 {
		return fmt.Errorf("must not contain %q", p[i])
	}
	if c := path.Clean(p); c != p && c+"/" != p {
		return fmt.Errorf("is not clean (%q)", c)
	}
	if p == BundleMapPath || p == BundleMapPath+"/" || strings.HasPrefix(p, BundlesPrefix) {
		return fmt.Errorf("collides with the %s and %s{trustDomain} routes", BundleMapPath, BundlesPrefix)
	}
	return nil
}

// Handler returns the HTTP handler of every route, without TLS: for tests,
// benchmarks and embedding behind another TLS terminator.
func (s *Server) Handler() http.Handler { return s.handler }

// Update re-reads the sources and re-renders what changed. Call it on
// every change signal of the sources (ca.Authority.Changes,
// FileSource.Changes, the federation store's); the next request sees the
// result. It is cheap when nothing changed (pointer comparisons), safe to
// call concurrently with requests and with itself, and idempotent.
//
// A bundle that cannot be served (another trust domain, no keys, not
// serializable) is refused: the last good document for its trust domain
// stays served, the error is logged once and returned.
func (s *Server) Update() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.snap.Load()
	next := &snapshot{byName: make(map[string]*document, len(prev.byName))}
	var errs []error

	local, revs := bundleOf(s.cfg.Local)
	doc, err := s.render(s.localName, local, revs, prev.byName[s.localName], true)
	if err != nil {
		errs = append(errs, err)
	}
	if doc != nil {
		next.local = doc
		next.byName[s.localName] = doc
	}
	if s.cfg.ServeOthers && s.cfg.Others != nil {
		for _, b := range s.cfg.Others() {
			if b == nil || b.TrustDomain().Name() == s.localName {
				continue
			}
			name := b.TrustDomain().Name()
			if _, dup := next.byName[name]; dup {
				errs = append(errs, s.refuse(dupKey+name, b, nil, fmt.Errorf("trust domain %q: more than one bundle held; serving the first", name)))
				continue
			}
			doc, err := s.render(name, b, s.othersRevocations(b), prev.byName[name], false)
			if err != nil {
				errs = append(errs, err)
			}
			if doc != nil {
				next.byName[name] = doc
			}
		}
	}
	if next.local != nil {
		if err := s.renderMap(prev, next); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.renderIssuers(prev, next)...)
	if !sameSnapshot(prev, next) {
		s.snap.Store(next)
		s.published(prev, next)
	}
	if len(errs) > 0 {
		return fmt.Errorf("bundleserver: %w", errors.Join(errs...))
	}
	return nil
}

// render returns the document for src with its revoked-authority entries
// revs, reusing prev when it was rendered from the same bundle and
// entries. A refused src yields prev (the last good document, possibly
// nil) and the error.
func (s *Server) render(name string, src *spiffebundle.Bundle, revs []bundledoc.Revocation, prev *document, local bool) (*document, error) {
	if src == nil || (prev != nil && prev.src == src && sameRevocations(prev.revs, revs)) {
		// A source that had a bundle and now has none keeps the last one
		// served: withdrawing it would look like an outage to peers.
		return prev, nil
	}
	if r, ok := s.refused[name]; ok && r.src == src && sameRevocations(r.revs, revs) {
		return prev, r.err
	}
	if err := s.checkBundle(name, src, local); err != nil {
		return prev, s.refuse(name, src, revs, err)
	}
	b := s.withRefreshHint(src, local)
	body, err := bundledoc.MarshalWithRevocations(b, revs)
	if err != nil {
		return prev, s.refuse(name, src, revs, err)
	}
	delete(s.refused, name)
	d := newDocument(src, b, body, cacheAge(b))
	d.revs = revs
	return d, nil
}

// othersRevocations are the entries to serve with b, one of Others.
func (s *Server) othersRevocations(b *spiffebundle.Bundle) []bundledoc.Revocation {
	if s.cfg.revocationsOf == nil {
		return nil
	}
	return s.cfg.revocationsOf(b)
}

// checkBundle says why src may not be served under name: the local bundle
// must be for our trust domain and, unless AllowEmpty, hold keys; a
// peer's name must be a valid trust domain name.
func (s *Server) checkBundle(name string, src *spiffebundle.Bundle, local bool) error {
	switch {
	case local && src.TrustDomain() != s.cfg.TrustDomain:
		return fmt.Errorf("bundle is for trust domain %q", src.TrustDomain().Name())
	case !local && !validName(name):
		return errors.New("invalid trust domain name")
	case local && !s.cfg.AllowEmpty && src.Empty():
		return errors.New(`bundle has no keys; serving "keys": [] would revoke every key at peers (set AllowEmpty to mean it)`)
	}
	return nil
}

// withRefreshHint is src with the configured RefreshHint when src is the
// local bundle and has none of its own; src itself otherwise, since a
// published bundle is never changed.
func (s *Server) withRefreshHint(src *spiffebundle.Bundle, local bool) *spiffebundle.Bundle {
	if _, ok := src.RefreshHint(); local && !ok && s.cfg.RefreshHint > 0 {
		b := src.Clone()
		b.SetRefreshHint(s.cfg.RefreshHint)
		return b
	}
	return src
}

func validName(name string) bool {
	_, err := bundledoc.TrustDomainName(name)
	return err == nil
}

// refuse records, counts and logs the refusal of src under key (a trust
// domain name, or dupKey and the name), once per src.
func (s *Server) refuse(key string, src *spiffebundle.Bundle, revs []bundledoc.Revocation, err error) error {
	if r, ok := s.refused[key]; ok && r.src == src && sameRevocations(r.revs, revs) {
		return r.err
	}
	if iss, ok := strings.CutPrefix(key, issuerKey); ok {
		err = fmt.Errorf("OIDC issuer %q: %w", iss, err)
		s.refused[key] = refusal{src: src, revs: revs, err: err}
		s.metrics.updateErrors.Inc()
		s.logger.Error("OIDC issuer keys not all published", logattr.Issuer, iss, logattr.TrustDomain, src.TrustDomain().Name(), logattr.Error, err)
		return err
	}
	name := strings.TrimPrefix(key, dupKey)
	if name == key {
		err = fmt.Errorf("trust domain %q: %w", name, err)
	}
	s.refused[key] = refusal{src: src, revs: revs, err: err}
	s.metrics.updateErrors.Inc()
	s.logger.Error("bundle refused; the last good document stays served", logattr.TrustDomain, name, logattr.Error, err)
	return err
}

// dupKey prefixes refusals of a second bundle for one trust domain, which
// must not be confused with the refusal of the first.
const dupKey = "duplicate "

// renderMap sets next's bundle map, reusing prev's when its members are
// the same documents.
func (s *Server) renderMap(prev, next *snapshot) error {
	names := make([]string, 0, len(next.byName))
	for name := range next.byName {
		names = append(names, name)
	}
	slices.Sort(names)
	members := make([]*document, len(names))
	bundles := make([]*spiffebundle.Bundle, len(names))
	for i, name := range names {
		members[i] = next.byName[name]
		bundles[i] = members[i].bundle
	}
	if prev.bundleMap != nil && slices.Equal(prev.mapMembers, members) {
		next.bundleMap, next.mapMembers = prev.bundleMap, prev.mapMembers
		return nil
	}
	body, err := bundledoc.MarshalMap(bundles)
	if err != nil {
		// Each member rendered on its own, so this is not expected; keep
		// the last map rather than serve one without a trust domain.
		next.bundleMap, next.mapMembers = prev.bundleMap, prev.mapMembers
		s.metrics.updateErrors.Inc()
		s.logger.Error("bundle map refused; the last good map stays served", logattr.Error, err)
		return fmt.Errorf("bundle map: %w", err)
	}
	age := maxCacheAge
	for _, m := range members {
		age = min(age, m.maxAge)
	}
	next.bundleMap, next.mapMembers = newDocument(nil, nil, body, age), members
	return nil
}

func sameSnapshot(a, b *snapshot) bool {
	if a.local != b.local || a.bundleMap != b.bundleMap || len(a.byName) != len(b.byName) || len(a.issuers) != len(b.issuers) {
		return false
	}
	for i := range a.issuers {
		if a.issuers[i].src != b.issuers[i].src {
			return false
		}
	}
	for name, d := range a.byName {
		if b.byName[name] != d {
			return false
		}
	}
	return true
}

// published logs and records what changed between two snapshots.
func (s *Server) published(prev, next *snapshot) {
	for name, d := range next.byName {
		if old := prev.byName[name]; old != nil && old.etag == d.etag {
			continue
		}
		if d.hasSequence {
			s.metrics.sequence.WithLabelValues(name).Set(float64(d.sequence))
		} else {
			s.metrics.sequence.DeleteLabelValues(name)
		}
		level := slog.LevelDebug
		if name == s.localName {
			level = slog.LevelInfo
		}
		s.logger.Log(context.Background(), level, "serving bundle", logattr.TrustDomain, name,
			logattr.Sequence, d.sequence, "authorities", d.authorityKeys, "etag", d.etag)
	}
	for name := range prev.byName {
		if _, ok := next.byName[name]; !ok {
			s.metrics.sequence.DeleteLabelValues(name)
			s.logger.Info("no longer serving bundle", logattr.TrustDomain, name)
		}
	}
	s.logIssuers(prev, next)
}

// Serve serves HTTPS on ln until ctx is done, then shuts down gracefully:
// in-flight requests finish within Timeouts.Shutdown, after which the
// remaining connections are closed. It closes ln. A nil error means ctx
// ended it.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.cfg.GetCertificate == nil {
		_ = ln.Close()
		return errors.New("bundleserver: Config.GetCertificate is required to serve TLS")
	}
	srv := s.httpServer(s.handler)
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	s.logger.Info("bundle endpoint serving", logattr.Address, ln.Addr().String(), logattr.TrustDomain, s.localName, "path", s.cfg.Path)
	select {
	case err := <-errc:
		return fmt.Errorf("bundleserver: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeouts.Shutdown)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		err = errors.Join(err, srv.Close())
		err = fmt.Errorf("bundleserver: shutdown: %w", err)
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("bundleserver: serve: %w", serr)
	}
	return err
}

// httpServer is the hardened HTTP server Serve runs; benchmarks run
// baselines on the same settings.
func (s *Server) httpServer(h http.Handler) *http.Server {
	t := s.cfg.Timeouts
	return &http.Server{
		Handler:           h,
		TLSConfig:         s.TLSConfig(),
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    MaxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: s.cfg.MaxConcurrentStreams,
			// A reader that stops reading holds a stream; WriteTimeout
			// bounds the request, this the connection.
			WriteByteTimeout: t.Write,
		},
		// Handshake failures from scanners are noise at info level.
		ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelDebug),
	}
}
