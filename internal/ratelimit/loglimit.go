package ratelimit

import (
	"log/slog"
	"time"

	"golang.org/x/time/rate"
)

// Defaults: about one line a second at the real level, ten at once.
const (
	DefaultLogEvery = time.Second
	DefaultLogBurst = 10
)

// Limiter picks the level of the next line. Safe for concurrent use; a nil
// Limiter never lowers a level.
type LogLimiter struct {
	lim *rate.Limiter
}

// New allows one line every every at the real level, burst at once. every
// of zero or less allows burst lines and then none, which tests use so that
// the count does not depend on how fast they run.
func NewLogLimiter(every time.Duration, burst int) *LogLimiter {
	limit := rate.Limit(0)
	if every > 0 {
		limit = rate.Every(every)
	}
	return &LogLimiter{lim: rate.NewLimiter(limit, burst)}
}

// NewDefault is New(DefaultEvery, DefaultBurst).
func NewDefaultLogLimiter() *LogLimiter { return NewLogLimiter(DefaultLogEvery, DefaultLogBurst) }

// Level returns want while the budget lasts, slog.LevelDebug beyond it. A
// want of Debug or below costs no budget: it is already quiet.
func (l *LogLimiter) Level(want slog.Level) slog.Level {
	if l == nil || want <= slog.LevelDebug || l.lim.Allow() {
		return want
	}
	return slog.LevelDebug
}
