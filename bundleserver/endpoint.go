package bundleserver

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultUpdateInterval is how often an Endpoint re-checks its sources
// when no change was signalled.
const DefaultUpdateInterval = 30 * time.Second

// EndpointConfig configures an Endpoint: a Server, the bundle files that
// add to or replace its sources, and the change signals that keep it
// current.
type EndpointConfig struct {
	// Config is the server's. Its Local (the CA, say) is served unless a
	// bundle file for the local trust domain replaces it; its Others
	// (federated bundles; may be nil) are served with the relayed files.
	Config

	// Changes signal that Local or Others changed. The files' own
	// signals are added by NewEndpoint.
	Changes []<-chan struct{}

	// Files are bundle documents served from files, reloaded on change:
	// "FILE" serves the local trust domain's bundle from FILE instead of
	// Local (static mode, for an offline CA), "TD=FILE" relays trust
	// domain TD's bundle. One file per trust domain.
	Files []string

	// OnRelayed, when set, hears each relayed file's current bundle, with
	// the file's path, once in NewEndpoint and before every update, so
	// that other consumers (a trust store) hold them too.
	OnRelayed func(path string, b *spiffebundle.Bundle)

	FilePollInterval time.Duration // DefaultFilePollInterval
	UpdateInterval   time.Duration // DefaultUpdateInterval
}

// FileError is a problem with one of EndpointConfig.Files, named by the
// spec as given, so callers can report it in their own terms (a flag).
type FileError struct {
	Spec string
	Err  error
}

func (e *FileError) Error() string {
	return fmt.Sprintf("bundleserver: bundle file %q: %v", e.Spec, e.Err)
}
func (e *FileError) Unwrap() error { return e.Err }

// Endpoint is a Server wired to its sources: it chooses between the CA
// and a static file for the local bundle, relays bundle files, and
// re-renders the documents whenever a source changes.
type Endpoint struct {
	srv       *Server
	files     []*FileSource // in the order of EndpointConfig.Files
	specs     []string
	relayed   []*FileSource
	changes   []<-chan struct{}
	onRelayed func(path string, b *spiffebundle.Bundle)
	poll      time.Duration
	update    time.Duration
	logger    *slog.Logger
}

// NewEndpoint loads every bundle file once (a file that cannot be served
// is an error: there would be nothing to serve from it) and builds the
// Server. It starts no goroutines; Run keeps the documents current.
func NewEndpoint(cfg EndpointConfig) (*Endpoint, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Endpoint{
		changes:   cfg.Changes,
		onRelayed: cfg.OnRelayed,
		poll:      cfg.FilePollInterval,
		update:    cfg.UpdateInterval,
		// The Server names its own component; the files and the update
		// loop are the endpoint's.
		logger: cfg.Logger.With(logattr.Component, "bundle-endpoint"),
	}
	if e.update <= 0 {
		e.update = DefaultUpdateInterval
	}
	local, err := e.openFiles(cfg.Files, cfg.TrustDomain)
	if err != nil {
		return nil, err
	}
	if local != nil {
		cfg.Local = local
	}
	if cfg.Issuers, err = e.issuerSources(cfg.Issuers, cfg.TrustDomain, cfg.Local); err != nil {
		return nil, err
	}
	cfg.Others = e.others(cfg.Others)
	cfg.revocationsOf = e.relayedRevocations
	if e.srv, err = New(cfg.Config); err != nil {
		return nil, err
	}
	e.syncRelayed()
	return e, nil
}

// openFiles loads the bundle files and returns the one for the local
// trust domain, if any.
func (e *Endpoint) openFiles(specs []string, td spiffeid.TrustDomain) (local *FileSource, err error) {
	seen := map[spiffeid.TrustDomain]string{}
	for _, spec := range specs {
		fileTD, path, err := ParseFileSpec(spec, td)
		if err != nil {
			return nil, &FileError{Spec: spec, Err: err}
		}
		if prev, dup := seen[fileTD]; dup {
			return nil, &FileError{Spec: spec, Err: fmt.Errorf("trust domain %s already comes from %q", fileTD.Name(), prev)}
		}
		seen[fileTD] = spec
		fs := NewFileSource(path, fileTD, e.logger)
		if err := fs.Load(); err != nil {
			return nil, &FileError{Spec: spec, Err: err}
		}
		e.files = append(e.files, fs)
		e.specs = append(e.specs, spec)
		e.changes = append(e.changes, fs.Changes())
		if fileTD == td {
			local = fs
			e.logger.Warn("serving the local trust domain's bundle from a file (static mode); the CA's own roots are not published unless the file holds them", "file", path)
			continue
		}
		e.relayed = append(e.relayed, fs)
	}
	return local, nil
}

// issuerSources gives each issuer without a Source its trust domain's
// bundle: the local one's (the CA, or the static file), or a relayed
// file's. Federated peers' bundles are never an issuer's: serving a
// peer's keys as an issuer would let whoever trusts the issuer accept
// tokens the peer mints, which only the peer's own operator may decide.
func (e *Endpoint) issuerSources(issuers []Issuer, td spiffeid.TrustDomain, local Source) ([]Issuer, error) {
	out := slices.Clone(issuers)
	for i := range out {
		if out[i].Source != nil {
			continue
		}
		if out[i].TrustDomain == td {
			out[i].Source = local
			continue
		}
		for _, fs := range e.relayed {
			if fs.td == out[i].TrustDomain {
				out[i].Source = fs
			}
		}
		if out[i].Source == nil {
			return nil, fmt.Errorf("bundleserver: issuer %q: trust domain %q is neither ours nor relayed from a bundle file (TD=FILE); only those are served as issuers",
				out[i].URL, out[i].TrustDomain.Name())
		}
	}
	return out, nil
}

// ParseFileSpec splits an EndpointConfig.Files spec, "TD=FILE"; a bare
// "FILE" is the local trust domain's.
func ParseFileSpec(spec string, local spiffeid.TrustDomain) (spiffeid.TrustDomain, string, error) {
	name, path, found := strings.Cut(spec, "=")
	if !found {
		return local, spec, nil
	}
	td, err := bundledoc.TrustDomainName(name)
	if err != nil {
		return spiffeid.TrustDomain{}, "", fmt.Errorf("trust domain %q: %w", name, err)
	}
	return td, path, nil
}

// others is base's bundles followed by the relayed files'.
func (e *Endpoint) others(base func() []*spiffebundle.Bundle) func() []*spiffebundle.Bundle {
	return func() []*spiffebundle.Bundle {
		var out []*spiffebundle.Bundle
		if base != nil {
			out = append(out, base()...)
		}
		for _, fs := range e.relayed {
			if b := fs.Bundle(); b != nil {
				out = append(out, b)
			}
		}
		return out
	}
}

// relayedRevocations are the entries of the relayed file whose current
// bundle is b: a relay serves what the file had.
func (e *Endpoint) relayedRevocations(b *spiffebundle.Bundle) []bundledoc.Revocation {
	for _, fs := range e.relayed {
		if revs, ok := fs.revocationsOf(b); ok {
			return revs
		}
	}
	return nil
}

func (e *Endpoint) syncRelayed() {
	if e.onRelayed == nil {
		return
	}
	for _, fs := range e.relayed {
		if b := fs.Bundle(); b != nil {
			e.onRelayed(fs.Path(), b)
		}
	}
}

// Server is the endpoint's server: Serve it on a listener.
func (e *Endpoint) Server() *Server { return e.srv }

// Files are the bundle file sources, in the order of EndpointConfig.Files.
func (e *Endpoint) Files() []*FileSource { return e.files }

// Ready reports the first bundle file whose latest change could not be
// served (the last good bundle still is), as a *FileError.
func (e *Endpoint) Ready() error {
	for i, fs := range e.files {
		if err := fs.LastError(); err != nil {
			return &FileError{Spec: e.specs[i], Err: fmt.Errorf("%w (serving the last good bundle)", err)}
		}
	}
	return nil
}

// Run polls the bundle files and re-renders the served documents on every
// change signal, and every UpdateInterval anyway, until ctx is done.
func (e *Endpoint) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, fs := range e.files {
		wg.Go(func() { _ = fs.Run(ctx, e.poll) }) // failures are logged and kept in LastError
	}
	merged := make(chan struct{}, 1)
	for _, ch := range e.changes {
		wg.Go(func() { forward(ctx, ch, merged) })
	}
	e.updateOnChange(ctx, merged)
	wg.Wait()
	return nil
}

// forward coalesces signals of ch into merged until ctx is done or ch is
// closed.
func forward(ctx context.Context, ch <-chan struct{}, merged chan<- struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
			select {
			case merged <- struct{}{}:
			default:
			}
		}
	}
}

func (e *Endpoint) updateOnChange(ctx context.Context, merged <-chan struct{}) {
	// A periodic update too: cheap when nothing changed, and it catches
	// a change signal another reader of a shared channel took.
	tick := time.NewTicker(e.update)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-merged:
		case <-tick.C:
		}
		e.syncRelayed()
		if err := e.srv.Update(); err != nil {
			// The Server logs each refusal once; this is for debugging.
			e.logger.Debug("bundle update refused; the last good document stays served", logattr.Error, err)
		}
	}
}
