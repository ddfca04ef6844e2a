package identitymap

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
// given no positive interval: an edit reaches new attestations within it.
const DefaultFilePollInterval = 5 * time.Second

// FileSource polls an identity map file and hands each new good
// Document's rules to a Combiner, as source "file:<path>". It polls rather
// than watching: Kubernetes updates Secret and ConfigMap volumes by
// swapping a "..data" symlink, which watches on the file miss. A bad
// change keeps the last good rules; the error is logged once per distinct
// problem and kept in the Combiner's Status and metrics.
type FileSource struct {
	path     string
	source   string
	comb     *Combiner
	logger   *slog.Logger
	interval time.Duration
	clock    clock.WithTicker

	r *fileutil.Reloader[[]byte, Document]

	// parseFailed and parseErr remember the last bytes Parse refused:
	// parsing is deterministic, so the same bytes fail the same way. The
	// Combiner's refusal (a rule name another source uses) depends on the
	// other sources, so it is tried again at every check. Guarded by r's
	// lock, as the Reloader's hooks are.
	parseFailed [sha256.Size]byte
	parseErr    string
}

// NewFileSource returns a source for the identity map file at path
// feeding comb. It reads nothing until Load. A nil logger discards;
// interval is DefaultFilePollInterval when not positive.
func NewFileSource(path string, comb *Combiner, logger *slog.Logger, interval time.Duration) *FileSource {
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
	f.r = fileutil.NewReloader(fileutil.ReloaderConfig[[]byte, Document]{
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
func (f *FileSource) Source() string { return f.source }

// Load reads the file for the first time. An error (a missing file
// included) means the operator's identity map is not in force: the caller
// should not start.
func (f *FileSource) Load() error { return f.r.Load() }

// Check reads the file once, as Run does each interval; the caller calls
// it on SIGHUP and reports the error. A good change goes to the Combiner;
// an unreadable or invalid file keeps the last good rules and returns the
// error.
func (f *FileSource) Check() error { return f.r.Check() }

// Run checks the file every interval until ctx is done. Failures are
// logged and recorded; they never end Run.
func (f *FileSource) Run(ctx context.Context) error {
	return f.r.Run(ctx, f.clock, f.interval)
}

// apply hands the rules of data to the Combiner.
func (f *FileSource) apply(data []byte, _ Document, _ bool) (Document, error) {
	digest := sha256.Sum256(data)
	var (
		doc Document
		err error
	)
	if f.parseErr != "" && digest == f.parseFailed {
		err = errors.New(f.parseErr)
	} else {
		doc, err = Parse(data, f.source)
	}
	if err != nil {
		f.parseFailed, f.parseErr = digest, err.Error()
		f.comb.SetSourceError(f.source, err)
		return Document{}, err
	}
	// The Combiner records its own refusals in Status and metrics.
	if err := f.comb.SetSourceDocument(f.source, doc); err != nil {
		return Document{}, err
	}
	f.logger.Info("identity map file loaded", logattr.PolicyRules, len(doc.Rules))
	if cs := f.comb.Conflicts(); len(cs) > 0 {
		f.logger.Warn("identity map rules conflict: workloads they both select get no identity",
			"conflicts", len(cs), logattr.Rule, cs[0].First.Name, logattr.Warning, cs[0].Message)
	}
	return doc, nil
}

// report logs err; the Reloader calls it once per distinct failure of
// Check. Load reports nothing: its caller does not start.
func (f *FileSource) report(err error) {
	f.logger.Warn("identity map file refused; keeping the last good rules", logattr.Error, err)
}

func (f *FileSource) read() ([]byte, error) {
	data, err := f.readFile()
	if err != nil {
		f.comb.SetSourceError(f.source, err)
	}
	return data, err
}

func (f *FileSource) readFile() ([]byte, error) {
	// cappedfile refuses what is not a regular file (a FIFO would block
	// the poller) and what is too large.
	data, _, err := fileutil.Read(f.path, MaxDocumentSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("identitymap: identity map file %s does not exist: create it (an empty file has no rules)", f.path)
	}
	if err != nil {
		return nil, fmt.Errorf("identitymap: identity map file %s: %w", f.path, err)
	}
	return data, nil
}
