package identitymap

import (
	"log/slog"
	"time"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultFilePollInterval is how often FileSource.Run reads the file when
// given no positive interval: an edit reaches new attestations within it.
const DefaultFilePollInterval = rulesource.DefaultFilePollInterval

// FileSource polls an identity map file and hands each new good
// Document's rules to a Combiner, as source "file:<path>"; a bad change
// keeps the last good rules (see rulesource.FileSource).
type FileSource = rulesource.FileSource[Document]

// FileSourceOption changes how NewFileSource builds a source (its clock,
// say).
type FileSourceOption func(*rulesource.FileConfig[Document])

// NewFileSource returns a source for the identity map file at path
// feeding comb. It reads nothing until Load, whose error (a missing file
// included) means the operator's identity map is not in force: the
// caller should not start. A nil logger discards; interval is
// DefaultFilePollInterval when not positive. Each good load that leaves
// rules in conflict logs a warning.
func NewFileSource(path string, comb *Combiner, logger *slog.Logger, interval time.Duration, opts ...FileSourceOption) *FileSource {
	cfg := rulesource.FileConfig[Document]{
		Path:        path,
		Combiner:    comb,
		Parse:       Parse,
		Rules:       func(d Document) int { return len(d.Rules) },
		MaxSize:     MaxDocumentSize,
		ErrorPrefix: "identitymap: identity map file",
		LogName:     "identity map file",
		Loaded: func(logger *slog.Logger, _ Document) {
			if cs := comb.Conflicts(); len(cs) > 0 {
				logger.Warn("identity map rules conflict: workloads they both select get no identity",
					"conflicts", len(cs), logattr.Rule, cs[0].First.Name, logattr.Warning, cs[0].Message)
			}
		},
		Logger:   logger,
		Interval: interval,
	}
	for _, o := range opts {
		o(&cfg)
	}
	return rulesource.NewFileSource(cfg)
}
