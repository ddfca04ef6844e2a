package fileutil

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/loop"
)

// Digest identifies the content of the files a Reloader reads: equal
// digests mean unchanged files, so nothing is parsed again.
type Digest = [sha256.Size]byte

// ErrChanging marks files caught mid-update (a writer between two files,
// or between two reads of a snapshot): a reason to look again, not a
// fault. Load reads again; Check leaves them for the next check and
// records nothing.
var ErrChanging = errors.New("files changed while being read")

// defaultLoadAttempts is how often Load reads files that are changing: a
// Kubernetes Secret or ConfigMap update swaps one symlink, so the next
// read is normally consistent.
const defaultLoadAttempts = 3

// ReloaderConfig is what a Reloader needs to know about its files. The
// hooks run one at a time, under the Reloader's lock, so they may keep
// state of their own without locking.
type ReloaderConfig[R, T any] struct {
	// Read reads the files once (required). An error wrapping ErrChanging
	// means a writer is at work; any other error is a failure.
	Read func() (R, error)
	// Digest identifies what Read returned (required).
	Digest func(R) Digest
	// Parse validates what was read and returns the value to serve
	// (required). cur is the value in force; have is false before the
	// first good load. An error wrapping ErrChanging is treated as
	// Read's.
	Parse func(r R, cur T, have bool) (T, error)

	// Verify, if set, checks the value in force again when the files did
	// not change, for checks that depend on something else (the time).
	Verify func(cur T) error
	// Same, if set, says that a parsed value is the one in force, so the
	// change is not signalled on Changes.
	Same func(prev, next T) bool
	// Wrap, if set, gives every failure its context (the file names).
	Wrap func(error) error
	// Refused, if set, is told of each distinct failure (other content, or
	// another error) found by Check, once while it persists, so a problem
	// that stays is logged or audited once, not every interval. Load's
	// failures are its caller's to report.
	Refused func(error)
	// Changing, if set, is told when Check finds the files mid-update.
	Changing func(error)

	// SkipRefused does not parse again the content of the last failure:
	// for a Parse that, given the same bytes and value in force, fails the
	// same way. Without it refused content is parsed at every check, as
	// content that is not valid yet may become so without changing.
	SkipRefused bool
	// ReparseAfterFailure parses unchanged content again after a failure,
	// for a Parse whose side effects a failure undid (a source whose error
	// replaced its rules in a shared status).
	ReparseAfterFailure bool
	// LoadAttempts bounds how often Load reads files that are changing;
	// not positive means 3.
	LoadAttempts int
}

// Reloader keeps the last good value parsed from files that change on
// disk (a bundle, a certificate and its key, a policy, a CA directory).
// A bad change keeps the last good value; the error is returned, kept in
// LastError and reported through Refused once per distinct problem.
//
// It polls rather than watching with inotify: Kubernetes updates Secret
// and ConfigMap volumes by swapping a "..data" symlink, which watches on
// the files miss, and reading a few KiB every few seconds costs nothing.
// Read follows the symlinks, and the content's digest tells a swap apart
// from an unchanged file, whatever the modification times say.
//
//	r := fileutil.NewReloader(fileutil.ReloaderConfig[[]byte, *Doc]{
//		Read:   func() ([]byte, error) { return os.ReadFile(path) },
//		Digest: sha256.Sum256,
//		Parse:  func(b []byte, _ *Doc, _ bool) (*Doc, error) { return parse(b) },
//	})
//	if err := r.Load(); err != nil { ... }
//	go r.Run(ctx, nil, 10*time.Second)
type Reloader[R, T any] struct {
	cfg ReloaderConfig[R, T]

	current atomic.Pointer[reloaded[T]]
	lastErr atomic.Pointer[error]
	changes chan struct{}

	mu sync.Mutex // serialises Load and Check; guards the fields below
	// failed, failedDigest and failedMsg are the last failure: its
	// content (zero when nothing was read) and error.
	failed       bool
	failedDigest Digest
	failedMsg    string
}

type reloaded[T any] struct {
	value  T
	digest Digest
}

// NewReloader returns a Reloader of the files cfg reads. It reads nothing
// until Load and starts no goroutine.
func NewReloader[R, T any](cfg ReloaderConfig[R, T]) *Reloader[R, T] {
	if cfg.LoadAttempts <= 0 {
		cfg.LoadAttempts = defaultLoadAttempts
	}
	return &Reloader[R, T]{cfg: cfg, changes: make(chan struct{}, 1)}
}

// Load reads the files for the first time, again while they are changing
// (up to LoadAttempts reads). An error means there is nothing to serve:
// the caller should not start. It is kept in LastError, not reported.
func (r *Reloader[R, T]) Load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	for range r.cfg.LoadAttempts {
		if err = r.checkLocked(false); !errors.Is(err, ErrChanging) {
			break
		}
	}
	if errors.Is(err, ErrChanging) {
		return r.refuse(Digest{}, err, false)
	}
	return err
}

// Check reads the files once, as Run does each interval; callers may call
// it on SIGHUP. A good change becomes the value in force and is signalled
// on Changes. Files caught mid-update are left for the next check: nil.
// A failure keeps the last good value and is returned.
func (r *Reloader[R, T]) Check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.checkLocked(true)
	if errors.Is(err, ErrChanging) {
		if r.cfg.Changing != nil {
			r.cfg.Changing(err)
		}
		return nil
	}
	return err
}

// checkLocked is one check. It returns an ErrChanging error unrecorded,
// for the caller to decide.
func (r *Reloader[R, T]) checkLocked(report bool) error {
	data, err := r.cfg.Read()
	if errors.Is(err, ErrChanging) {
		return err
	}
	if err != nil {
		return r.refuse(Digest{}, err, report)
	}
	digest := r.cfg.Digest(data)
	cur := r.current.Load()
	if done, err := r.settledLocked(cur, digest, report); done {
		return err
	}
	return r.adoptLocked(cur, data, digest, report)
}

// settledLocked ends a check that needs no parse: the content in force
// (unchanged, or changed back to it), verified again when Verify is set; or,
// with SkipRefused, the content refused last time. done is false when the
// content must be parsed.
func (r *Reloader[R, T]) settledLocked(cur *reloaded[T], digest Digest, report bool) (done bool, err error) {
	switch {
	case cur != nil && digest == cur.digest && !(r.cfg.ReparseAfterFailure && r.failed):
		if r.cfg.Verify != nil {
			if err := r.cfg.Verify(cur.value); err != nil {
				return true, r.refuse(digest, err, report)
			}
		}
		r.succeed()
		return true, nil
	case r.cfg.SkipRefused && r.failed && digest == r.failedDigest:
		return true, r.LastError()
	}
	return false, nil
}

// adoptLocked parses new content and, if it parses, puts it in force and
// signals a change, unless Same says the value did not change.
func (r *Reloader[R, T]) adoptLocked(cur *reloaded[T], data R, digest Digest, report bool) error {
	var (
		value T
		have  bool
	)
	if cur != nil {
		value, have = cur.value, true
	}
	next, err := r.cfg.Parse(data, value, have)
	if errors.Is(err, ErrChanging) {
		return err
	}
	if err != nil {
		return r.refuse(digest, err, report)
	}
	r.current.Store(&reloaded[T]{value: next, digest: digest})
	r.succeed()
	if !have || r.cfg.Same == nil || !r.cfg.Same(value, next) {
		select {
		case r.changes <- struct{}{}:
		default:
		}
	}
	return nil
}

// refuse records a failure of content digest, reporting it if report and
// it is not the last failure again.
func (r *Reloader[R, T]) refuse(digest Digest, err error, report bool) error {
	if r.cfg.Wrap != nil {
		err = r.cfg.Wrap(err)
	}
	repeated := r.failed && digest == r.failedDigest && err.Error() == r.failedMsg
	r.fail(digest, err)
	if report && !repeated && r.cfg.Refused != nil {
		r.cfg.Refused(err)
	}
	return err
}

func (r *Reloader[R, T]) fail(digest Digest, err error) {
	r.failed, r.failedDigest, r.failedMsg = true, digest, err.Error()
	r.lastErr.Store(&err)
}

func (r *Reloader[R, T]) succeed() {
	r.failed, r.failedDigest, r.failedMsg = false, Digest{}, ""
	r.lastErr.Store(nil)
}

// Current returns the last good value; ok is false before a successful
// Load.
func (r *Reloader[R, T]) Current() (value T, ok bool) {
	if cur := r.current.Load(); cur != nil {
		return cur.value, true
	}
	return value, false
}

// LastError is the outcome of the latest Load or Check: nil when the
// files were good (or caught mid-update by Check).
func (r *Reloader[R, T]) LastError() error {
	if p := r.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Changes is signalled (coalesced) whenever Current changes.
func (r *Reloader[R, T]) Changes() <-chan struct{} { return r.changes }

// Run checks the files every interval on clk (the real clock when nil)
// until ctx is done, then returns nil. Failures are reported and kept in
// LastError; they never end Run.
func (r *Reloader[R, T]) Run(ctx context.Context, clk clock.WithTicker, interval time.Duration) error {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return loop.Poll(ctx, clk, interval, func() { _ = r.Check() })
}
