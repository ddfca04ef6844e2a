package trustpolicy

import (
	"log/slog"
	"time"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
)

// DefaultFilePollInterval is how often FileSource.Run reads the file when
// given no positive interval: a policy edit reaches SDS streams within it.
const DefaultFilePollInterval = rulesource.DefaultFilePollInterval

// FileSource polls a policy file and hands each new good Document's rules
// to a Combiner, as source "file:<path>"; a bad change keeps the last
// good rules (see rulesource.FileSource).
type FileSource = rulesource.FileSource[Document]

// FileSourceOption changes how NewFileSource builds a source.
type FileSourceOption func(*rulesource.FileConfig[Document])

// WithRefusedHook calls hook once per distinct refusal after Load (the
// same bytes refused the same way again, or the same read error, do not
// call it again), so the caller can audit it; Load's error is the
// caller's to handle.
func WithRefusedHook(hook func(source string, err error)) FileSourceOption {
	return func(c *rulesource.FileConfig[Document]) { c.Refused = hook }
}

// NewFileSource returns a source for the policy file at path feeding comb.
// It reads nothing until Load, whose error (a missing file included)
// means the operator's policy is not in force: the caller should not
// start. A nil logger discards; interval is DefaultFilePollInterval when
// not positive.
func NewFileSource(path string, comb *Combiner, logger *slog.Logger, interval time.Duration, opts ...FileSourceOption) *FileSource {
	cfg := rulesource.FileConfig[Document]{
		Path:        path,
		Combiner:    comb,
		Parse:       Parse,
		Rules:       func(d Document) int { return len(d.Rules) },
		MaxSize:     MaxDocumentSize,
		ErrorPrefix: "trustpolicy: policy file",
		MissingHint: " or drop --trust-policy",
		LogName:     "trust policy file",
		Logger:      logger,
		Interval:    interval,
	}
	for _, o := range opts {
		o(&cfg)
	}
	return rulesource.NewFileSource(cfg)
}
