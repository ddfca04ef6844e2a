package rulesource

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultFilePollInterval is how often FileSource.Run reads the file when
// given no positive interval: an edit is in force within it.
const DefaultFilePollInterval = 5 * time.Second

// Combiner is what a FileSource feeds: the good documents it reads, or
// the error that kept one out.
type Combiner[D any] interface {
	// SetSourceDocument puts doc's rules in force as source's; an error
	// (the combiner's refusal) keeps its last good ones.
	SetSourceDocument(source string, doc D) error
	// SetSourceError records why source's file could not be read or
	// parsed; its last good rules stay.
	SetSourceError(source string, err error)
}

// FileConfig is what a FileSource of documents D needs: the file, its
// parser and combiner, and the words its logs and errors use. Path,
// Combiner, Parse, Rules, MaxSize, ErrorPrefix and LogName are required.
type FileConfig[D any] struct {
	Path     string
	Combiner Combiner[D]
	// Parse parses the file's bytes; source names it in the errors.
	Parse func(data []byte, source string) (D, error)
	// Rules counts a document's rules, for the log.
	Rules func(D) int
	// MaxSize caps what is read, in bytes.
	MaxSize int64

	// ErrorPrefix begins the read errors: "trustpolicy: policy file".
	ErrorPrefix string
	// MissingHint ends the error of a missing file, after "create it (an
	// empty file has no rules)": " or drop --trust-policy".
	MissingHint string
	// LogName names the file in the log: "trust policy file".
	LogName string

	// Loaded, if set, is called after each good load with the source's
	// logger, for what the new combined rules warrant a warning of.
	Loaded func(logger *slog.Logger, doc D)
	// Refused, if set, is told of each distinct refusal found by Check
	// (the same bytes refused the same way again, or the same read error,
	// do not call it again), so the caller can audit it. Load's refusal
	// is its caller's to handle.
	Refused func(source string, err error)

	// Logger logs loads and refusals; nil discards.
	Logger *slog.Logger
	// Interval is how often Run reads the file; DefaultFilePollInterval
	// when not positive.
	Interval time.Duration
	// Clock times Run; nil is the real clock.
	Clock clock.WithTicker
}

// FileSource polls a rules file and hands each new good document to a
// Combiner, as source "file:<path>". It polls rather than watching:
// Kubernetes updates Secret and ConfigMap volumes by swapping a "..data"
// symlink, which watches on the file miss. A bad change keeps the last
// good rules; the error is logged once per distinct problem and kept in
// the Combiner's Status and metrics.
type FileSource[D any] struct {
	cfg    FileConfig[D]
	source string
	logger *slog.Logger

	r *fileutil.Reloader[[]byte, D]

	// parseFailed and parseErr remember the last bytes Parse refused:
	// parsing is deterministic, so the same bytes fail the same way.
	// Nothing else is cached: a read error says nothing about the next
	// read, and the Combiner's refusal (a rule name another source
	// already uses) depends on the other sources, so both are tried again
	// at every check. Guarded by r's lock, as the Reloader's hooks are.
	parseFailed [sha256.Size]byte
	parseErr    string
}

// NewFileSource returns a source for the file cfg names. It reads nothing
// until Load.
func NewFileSource[D any](cfg FileConfig[D]) *FileSource[D] {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultFilePollInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	source := "file:" + cfg.Path
	f := &FileSource[D]{cfg: cfg, source: source, logger: cfg.Logger.With(logattr.PolicySource, source)}
	f.r = fileutil.NewReloader(fileutil.ReloaderConfig[[]byte, D]{
		Read:    f.read,
		Digest:  sha256.Sum256,
		Parse:   f.apply,
		Refused: f.report,
		// A failure recorded an error in the Combiner in place of the
		// rules: the same bytes, back, must be handed to it again.
		ReparseAfterFailure: true,
	})
	return f
}

// Source is the source name the rules have in the Combiner.
func (f *FileSource[D]) Source() string { return f.source }

// Load reads the file for the first time. An error (a missing file
// included) means the operator's rules are not in force: the caller
// should not start.
func (f *FileSource[D]) Load() error { return f.r.Load() }

// Check reads the file once, as Run does each interval; the caller calls
// it on SIGHUP and reports the error. A good change goes to the Combiner;
// an unreadable or invalid file keeps the last good rules and returns the
// error.
func (f *FileSource[D]) Check() error { return f.r.Check() }

// Run checks the file every interval until ctx is done. Failures are
// logged and recorded; they never end Run.
func (f *FileSource[D]) Run(ctx context.Context) error {
	return f.r.Run(ctx, f.cfg.Clock, f.cfg.Interval)
}

// apply hands the rules of data to the Combiner. Parsing is
// deterministic: the same bytes fail the same way, so only the parse is
// skipped for them; the failure is still recorded (and reported once per
// distinct failure), as another failure may have come in between.
func (f *FileSource[D]) apply(data []byte, _ D, _ bool) (D, error) {
	digest := sha256.Sum256(data)
	var (
		doc  D
		zero D
		err  error
	)
	if f.parseErr != "" && digest == f.parseFailed {
		err = errors.New(f.parseErr)
	} else {
		doc, err = f.cfg.Parse(data, f.source)
	}
	if err != nil {
		f.parseFailed, f.parseErr = digest, err.Error()
		f.cfg.Combiner.SetSourceError(f.source, err)
		return zero, err
	}
	// The Combiner records its own refusals in Status and metrics.
	if err := f.cfg.Combiner.SetSourceDocument(f.source, doc); err != nil {
		return zero, err
	}
	f.logger.Info(f.cfg.LogName+" loaded", logattr.PolicyRules, f.cfg.Rules(doc))
	if f.cfg.Loaded != nil {
		f.cfg.Loaded(f.logger, doc)
	}
	return doc, nil
}

// report logs err and calls the Refused hook; the Reloader calls it once
// per distinct failure of Check (what failed and how). Load reports
// nothing: its caller does not start.
func (f *FileSource[D]) report(err error) {
	f.logger.Warn(f.cfg.LogName+" refused; keeping the last good rules", logattr.Error, err)
	if f.cfg.Refused != nil {
		f.cfg.Refused(f.source, err)
	}
}

func (f *FileSource[D]) read() ([]byte, error) {
	data, err := f.readFile()
	if err != nil {
		f.cfg.Combiner.SetSourceError(f.source, err)
	}
	return data, err
}

func (f *FileSource[D]) readFile() ([]byte, error) {
	// cappedfile refuses what is not a regular file (a FIFO would block
	// the poller, and SIGHUP's Check behind it) and what is too large.
	data, _, err := fileutil.Read(f.cfg.Path, f.cfg.MaxSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s %s does not exist: create it (an empty file has no rules)%s", f.cfg.ErrorPrefix, f.cfg.Path, f.cfg.MissingHint)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", f.cfg.ErrorPrefix, f.cfg.Path, err)
	}
	return data, nil
}
