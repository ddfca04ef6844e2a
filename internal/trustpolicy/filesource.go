package trustpolicy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/poll"
)

// DefaultFilePollInterval is how often FileSource.Run reads the file when
// given no positive interval: a policy edit reaches SDS streams within it.
const DefaultFilePollInterval = 5 * time.Second

// FileSource polls a policy file and hands each new good Document's rules
// to a Combiner, as source "file:<path>". It polls rather than watching:
// Kubernetes updates Secret and ConfigMap volumes by swapping a "..data"
// symlink, which watches on the file miss. A bad change keeps the last
// good rules; the error is logged once per distinct problem and kept in
// the Combiner's Status and metrics.
type FileSource struct {
	path     string
	source   string
	comb     *Combiner
	logger   *slog.Logger
	interval time.Duration
	clock    clock.WithTicker
	refused  func(source string, err error)

	mu sync.Mutex // serialises checks; guards the fields below
	// good is the digest of the content in force; loaded says there is
	// one. failed and failedMsg identify the last refused content, so a
	// problem that persists is reported once, not every interval.
	good      [sha256.Size]byte
	loaded    bool
	failed    [sha256.Size]byte
	failedMsg string
}

// FileSourceOption changes how NewFileSource builds a source.
type FileSourceOption func(*FileSource)

// WithRefusedHook calls hook once per distinct refused change after Load
// (the same bad bytes polled again do not call it again), so the caller
// can audit it; Load's error is the caller's to handle.
func WithRefusedHook(hook func(source string, err error)) FileSourceOption {
	return func(f *FileSource) { f.refused = hook }
}

// NewFileSource returns a source for the policy file at path feeding comb.
// It reads nothing until Load. A nil logger discards; interval is
// DefaultFilePollInterval when not positive.
func NewFileSource(path string, comb *Combiner, logger *slog.Logger, interval time.Duration, opts ...FileSourceOption) *FileSource {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = DefaultFilePollInterval
	}
	source := "file:" + path
	f := &FileSource{
		path:     path,
		source:   source,
		comb:     comb,
		logger:   logger.With(logattr.PolicySource, source),
		interval: interval,
		clock:    clock.RealClock{},
	}
	for _, o := range opts {
		o(f)
	}
	return f
}

// Source is the source name the rules have in the Combiner.
func (f *FileSource) Source() string { return f.source }

// Load reads the file for the first time. An error (a missing file
// included) means the operator's policy is not in force: the caller
// should not start.
func (f *FileSource) Load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checkLocked(false)
}

// Check reads the file once, as Run does each interval; cmd calls it on
// SIGHUP and reports the error. A good change goes to the Combiner; an
// unreadable or invalid file keeps the last good rules and returns the
// error.
func (f *FileSource) Check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checkLocked(true)
}

// Run checks the file every interval until ctx is done. Failures are
// logged and recorded; they never end Run.
func (f *FileSource) Run(ctx context.Context) error {
	return poll.Run(ctx, f.clock, f.interval, func() { _ = f.Check() })
}

func (f *FileSource) checkLocked(logFailure bool) error {
	data, err := f.read()
	digest := sha256.Sum256(data)
	recorded := false // by the Combiner, which saw the rules
	if err == nil {
		switch {
		case f.loaded && digest == f.good && f.failedMsg == "":
			return nil // unchanged
		case digest == f.failed && f.failedMsg != "":
			// Parsing is deterministic: the same bytes fail the same way.
			return errors.New(f.failedMsg)
		}
		recorded, err = f.apply(data)
	}
	if err != nil {
		if digest != f.failed || err.Error() != f.failedMsg {
			if !recorded {
				f.comb.SetSourceError(f.source, err)
			}
			if logFailure {
				f.logger.Warn("trust policy file refused; keeping the last good rules", logattr.Error, err)
				if f.refused != nil {
					f.refused(f.source, err)
				}
			}
		}
		f.failed, f.failedMsg = digest, err.Error()
		return err
	}
	f.good, f.loaded = digest, true
	f.failed, f.failedMsg = [sha256.Size]byte{}, ""
	return nil
}

// apply parses data and gives it to the Combiner; recorded says the
// Combiner has recorded the outcome.
func (f *FileSource) apply(data []byte) (recorded bool, err error) {
	doc, err := Parse(data, f.source)
	if err != nil {
		return false, err
	}
	if err := f.comb.SetSourceDocument(f.source, doc); err != nil {
		return true, err
	}
	f.logger.Info("trust policy file loaded", logattr.PolicyRules, len(doc.Rules))
	return true, nil
}

func (f *FileSource) read() ([]byte, error) {
	file, err := os.Open(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("trustpolicy: policy file %s does not exist: create it (an empty file has no rules) or drop --trust-policy", f.path)
	}
	if err != nil {
		return nil, fmt.Errorf("trustpolicy: policy file: %w", err)
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, MaxDocumentSize+1))
	if err != nil {
		return nil, fmt.Errorf("trustpolicy: policy file: %w", err)
	}
	// Parse refuses an oversized document; reading one byte more than
	// the limit is enough to know.
	return data, nil
}
