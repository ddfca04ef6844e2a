package ratelimit

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLevel(t *testing.T) {
	tests := []struct {
		name  string
		lim   *LogLimiter
		want  slog.Level
		calls int
		// real is how many calls keep want.
		real int
	}{
		{"burst then debug", NewLogLimiter(0, 3), slog.LevelWarn, 10, 3},
		{"errors too", NewLogLimiter(0, 2), slog.LevelError, 5, 2},
		{"debug costs nothing", NewLogLimiter(0, 0), slog.LevelDebug, 5, 5},
		{"nil never lowers", nil, slog.LevelError, 5, 5},
		{"zero burst", NewLogLimiter(0, 0), slog.LevelInfo, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			real := 0
			for range tt.calls {
				switch got := tt.lim.Level(tt.want); got {
				case tt.want:
					real++
				default:
					assert.Equal(t, slog.LevelDebug, got)
				}
			}
			assert.Equal(t, tt.real, real)
		})
	}
}

// Debug lines do not spend the budget of the lines that matter.
func TestDebugDoesNotSpend(t *testing.T) {
	l := NewLogLimiter(0, 1)
	for range 5 {
		l.Level(slog.LevelDebug)
	}
	assert.Equal(t, slog.LevelWarn, l.Level(slog.LevelWarn))
	assert.Equal(t, slog.LevelDebug, l.Level(slog.LevelWarn))
}
