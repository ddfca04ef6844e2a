package bundleserver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/poll"
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

	current atomic.Pointer[fileBundle]
	lastErr atomic.Pointer[error]
	changes chan struct{}

	mu sync.Mutex // serialises checks; guards the fields below
	// failedDigest and failedMsg identify the last refused content, so a
	// problem that persists is logged once, not every interval.
	failedDigest [sha256.Size]byte
	failedMsg    string
}

type fileBundle struct {
	bundle *spiffebundle.Bundle
	digest [sha256.Size]byte
}

// NewFileSource returns a source for the bundle of td in the file at path.
// It reads nothing until Load. A nil logger discards.
func NewFileSource(path string, td spiffeid.TrustDomain, logger *slog.Logger) *FileSource {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &FileSource{
		path:    path,
		td:      td,
		logger:  logger.With("bundle_file", path, logattr.TrustDomain, td.Name()),
		changes: make(chan struct{}, 1),
	}
}

// Load reads the file for the first time. An error means there is nothing
// to serve: the caller should not start.
func (f *FileSource) Load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checkLocked(false)
}

// Check reads the file once, as Run does each interval; cmd may call it on
// SIGHUP. A valid change becomes the current bundle and is signalled on
// Changes. An unreadable or invalid file keeps the last good bundle; the
// error is returned, kept in LastError and logged once per distinct
// problem.
func (f *FileSource) Check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checkLocked(true)
}

func (f *FileSource) checkLocked(logFailure bool) error {
	var digest [sha256.Size]byte
	data, err := f.read()
	if err == nil {
		digest = sha256.Sum256(data)
		cur := f.current.Load()
		switch {
		case cur != nil && digest == cur.digest:
			// Unchanged, or changed back to the good content.
		case digest == f.failedDigest && f.failedMsg != "":
			// Parsing is deterministic: the same bytes fail the same way.
			return f.LastError()
		default:
			err = f.apply(data, digest, cur)
		}
	}
	if err != nil {
		err = fmt.Errorf("bundleserver: bundle file %s: %w", f.path, err)
		if logFailure && (digest != f.failedDigest || err.Error() != f.failedMsg) {
			f.logger.Error("bundle file refused; keeping the last good bundle", logattr.Error, err)
		}
		f.failedDigest, f.failedMsg = digest, err.Error()
		f.lastErr.Store(&err)
		return err
	}
	f.failedDigest, f.failedMsg = [sha256.Size]byte{}, ""
	f.lastErr.Store(nil)
	return nil
}

func (f *FileSource) read() ([]byte, error) {
	file, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return bundledoc.ReadLimited(file, MaxFileSize)
}

// apply parses data and, if it is a good bundle, makes it current.
func (f *FileSource) apply(data []byte, digest [sha256.Size]byte, cur *fileBundle) error {
	b, warnings, err := bundledoc.Parse(f.td, data)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		if w.Code == bundledoc.CodeForeignTrustDomain {
			// A root naming another trust domain means the file is for the
			// wrong trust domain: relaying it would make peers trust one
			// domain's keys for another.
			return fmt.Errorf("%s; refusing to serve it as %s", w.String(), f.td.Name())
		}
		f.logger.Warn("bundle file: element ignored or kept with a warning", logattr.Warning, w.String())
	}
	if cur != nil {
		if err := checkSuccessor(cur.bundle, b); err != nil {
			return err
		}
	}
	if cur != nil && cur.bundle.Equal(b) {
		// Reformatted, same bundle: keep the pointer so the server has
		// nothing to re-render, and signal nothing.
		f.current.Store(&fileBundle{bundle: cur.bundle, digest: digest})
		return nil
	}
	f.current.Store(&fileBundle{bundle: b, digest: digest})
	seq, _ := b.SequenceNumber()
	f.logger.Info("bundle file loaded", logattr.Sequence, seq)
	select {
	case f.changes <- struct{}{}:
	default:
	}
	return nil
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
	if cur := f.current.Load(); cur != nil {
		return cur.bundle
	}
	return nil
}

// LastError is the outcome of the latest Load or Check: nil when the file
// was good.
func (f *FileSource) LastError() error {
	if p := f.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Changes is signalled (coalesced) whenever Bundle changes.
func (f *FileSource) Changes() <-chan struct{} { return f.changes }

// Run checks the file every interval (DefaultFilePollInterval if not
// positive) until ctx is done. Failures are logged and kept in LastError;
// they never end Run.
func (f *FileSource) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultFilePollInterval
	}
	return poll.Run(ctx, clock.RealClock{}, interval, func() { _ = f.Check() })
}

// Path is the file the source reads.
func (f *FileSource) Path() string { return f.path }
