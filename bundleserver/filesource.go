package bundleserver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultFilePollInterval is how often FileSource.Run checks the file
// when given no positive interval.
const DefaultFilePollInterval = 10 * time.Second

// MaxFileSize caps a bundle file; real bundles are a few KiB.
const MaxFileSize = bundledoc.DefaultMaxSize

// FileSource is a Source that serves a SPIFFE bundle document from a file,
// for relays and offline CAs. It polls rather than watching with inotify:
// Kubernetes updates Secret and ConfigMap volumes by swapping a "..data"
// symlink, which watches on the file miss, and reading a few KiB every few
// seconds costs nothing. A bad change keeps the last good bundle.
type FileSource struct {
	path   string
	td     spiffeid.TrustDomain
	logger *slog.Logger
	r      *fileutil.Reloader[[]byte, *fileBundle]
}

// fileBundle is what one version of the file holds: the bundle and the
// revoked authorities it lists (bundledoc.RevokedMember), read together
// so that they are always served together.
type fileBundle struct {
	b    *spiffebundle.Bundle
	revs []bundledoc.Revocation
}

var _ RevocationSource = (*FileSource)(nil)

// NewFileSource returns a source for the bundle of td in the file at path.
// It reads nothing until Load. A nil logger discards.
func NewFileSource(path string, td spiffeid.TrustDomain, logger *slog.Logger) *FileSource {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	f := &FileSource{
		path:   path,
		td:     td,
		logger: logger.With("bundle_file", path, logattr.TrustDomain, td.Name()),
	}
	f.r = fileutil.NewReloader(fileutil.ReloaderConfig[[]byte, *fileBundle]{
		Read:   f.read,
		Digest: sha256.Sum256,
		Parse:  f.parse,
		// Reformatted, same bundle: the server has nothing to re-render.
		Same: func(prev, next *fileBundle) bool { return prev == next },
		Wrap: func(err error) error { return fmt.Errorf("bundleserver: bundle file %s: %w", f.path, err) },
		Refused: func(err error) {
			f.logger.Error("bundle file refused; keeping the last good bundle", logattr.Error, err)
		},
		// Parsing is deterministic: the same bytes fail the same way.
		SkipRefused: true,
	})
	return f
}

// Load reads the file for the first time. An error means there is nothing
// to serve: the caller should not start.
func (f *FileSource) Load() error { return f.r.Load() }

// Check reads the file once, as Run does each interval; cmd may call it on
// SIGHUP. A valid change becomes the current bundle and is signalled on
// Changes. An unreadable or invalid file keeps the last good bundle; the
// error is returned, kept in LastError and logged once per distinct
// problem.
func (f *FileSource) Check() error { return f.r.Check() }

func (f *FileSource) read() ([]byte, error) {
	file, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return bundledoc.ReadLimited(file, MaxFileSize)
}

// parse returns the bundle in data if it is a good successor of cur, cur
// itself if it is the same bundle and entries reformatted.
func (f *FileSource) parse(data []byte, cur *fileBundle, have bool) (*fileBundle, error) {
	b, warnings, err := bundledoc.Parse(f.td, data)
	if err != nil {
		return nil, err
	}
	revs, err := bundledoc.ParseRevocations(data)
	if err != nil {
		return nil, err
	}
	if r, ok := bundledoc.RevokedAuthority(b, revs); ok {
		// Peers would refuse the document; serving it would cut them off.
		return nil, fmt.Errorf("%s lists %s, which the bundle still carries; remove one or the other", bundledoc.RevokedMember, r)
	}
	for _, w := range warnings {
		if w.Code == bundledoc.CodeForeignTrustDomain {
			// A root naming another trust domain means the file is for the
			// wrong trust domain: relaying it would make peers trust one
			// domain's keys for another.
			return nil, fmt.Errorf("%s; refusing to serve it as %s", w.String(), f.td.Name())
		}
		f.logger.Warn("bundle file: element ignored or kept with a warning", logattr.Warning, w.String())
	}
	if have {
		if err := checkSuccessor(cur.b, b); err != nil {
			return nil, err
		}
		if cur.b.Equal(b) && sameRevocations(cur.revs, revs) {
			// Keep the pointer so the server has nothing to re-render,
			// and signal nothing.
			return cur, nil
		}
	}
	seq, _ := b.SequenceNumber()
	f.logger.Info("bundle file loaded", logattr.Sequence, seq, "revoked", len(revs))
	return &fileBundle{b: b, revs: revs}, nil
}

// checkSuccessor refuses a replacement that peers would refuse: a lower
// spiffe_sequence, or the same sequence with other keys. trustbridge's own
// federation client rejects both (and keeps its old bundle for good),
// while go-spiffe and SPIRE peers would roll back to keys already removed.
func checkSuccessor(old, next *spiffebundle.Bundle) error {
	os, oldHas := old.SequenceNumber()
	ns, newHas := next.SequenceNumber()
	if !oldHas || !newHas {
		return nil
	}
	switch {
	case ns < os:
		return fmt.Errorf("spiffe_sequence went back from %d to %d; peers would reject or roll back", os, ns)
	case ns == os && !sameKeys(old, next):
		return fmt.Errorf("spiffe_sequence %d is unchanged but the keys changed; bump the sequence", ns)
	}
	return nil
}

func sameKeys(a, b *spiffebundle.Bundle) bool {
	a, b = a.Clone(), b.Clone()
	a.ClearRefreshHint()
	b.ClearRefreshHint()
	return a.Equal(b)
}

// Bundle returns the last good bundle, or nil before a successful Load.
func (f *FileSource) Bundle() *spiffebundle.Bundle {
	if cur, ok := f.r.Current(); ok {
		return cur.b
	}
	return nil
}

// Revocations returns the revoked authorities the last good file lists.
func (f *FileSource) Revocations() []bundledoc.Revocation {
	if cur, ok := f.r.Current(); ok {
		return cur.revs
	}
	return nil
}

// revocationsOf returns the entries the file lists when b is its current
// bundle, and whether it is.
func (f *FileSource) revocationsOf(b *spiffebundle.Bundle) ([]bundledoc.Revocation, bool) {
	cur, ok := f.r.Current()
	if !ok || cur.b != b {
		return nil, false
	}
	return cur.revs, true
}

// LastError is the outcome of the latest Load or Check: nil when the file
// was good.
func (f *FileSource) LastError() error { return f.r.LastError() }

// Changes is signalled (coalesced) whenever Bundle changes.
func (f *FileSource) Changes() <-chan struct{} { return f.r.Changes() }

// Run checks the file every interval (DefaultFilePollInterval if not
// positive) until ctx is done. Failures are logged and kept in LastError;
// they never end Run.
func (f *FileSource) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultFilePollInterval
	}
	return f.r.Run(ctx, clock.RealClock{}, interval)
}

// Path is the file the source reads.
func (f *FileSource) Path() string { return f.path }
