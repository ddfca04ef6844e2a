package federation

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// stateOf's rule, case by case: pending only until a first poll, or for
// the first polls of an endpoint that served nothing yet; an endpoint that
// never answered within 3 polls or 3 refresh intervals of its first poll
// is failing (nothing held) or stale (a bootstrap bundle held).
func TestStateOf(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const interval = 5 * time.Minute
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	tests := []struct {
		name string
		f    stateFacts
		want State
	}{
		{"never polled, nothing held", stateFacts{}, StatePending},
		{"never polled, bootstrap held", stateFacts{held: true}, StatePending},
		{"restored, not polled since the start", stateFacts{held: true, lastSuccess: ago(time.Hour)}, StatePending},

		{"first poll failed, nothing held", stateFacts{failures: 1, firstAttempt: ago(time.Second)}, StatePending},
		{"second poll failed, nothing held", stateFacts{failures: 2, firstAttempt: ago(3 * time.Second)}, StatePending},
		{"third poll failed, nothing held", stateFacts{failures: 3, firstAttempt: ago(7 * time.Second)}, StateFailing},
		{"many polls failed, nothing held", stateFacts{failures: 8, firstAttempt: ago(10 * time.Minute)}, StateFailing},
		{"one slow failed poll, 3 intervals after the first", stateFacts{failures: 1, firstAttempt: ago(3 * interval)}, StateFailing},
		{"one failed poll, just under 3 intervals", stateFacts{failures: 1, firstAttempt: ago(3*interval - time.Second)}, StatePending},
		{"polled, not failed, nothing held yet", stateFacts{firstAttempt: ago(time.Hour)}, StatePending},

		{"bootstrap held, first poll failed", stateFacts{held: true, failures: 1, firstAttempt: ago(time.Second)}, StateFailing},
		{"bootstrap held, third poll failed", stateFacts{held: true, failures: 3, firstAttempt: ago(7 * time.Second)}, StateStale},
		{"bootstrap held, one failed poll 3 intervals ago", stateFacts{held: true, failures: 1, firstAttempt: ago(3 * interval)}, StateStale},

		{"fetched, last poll ok", stateFacts{held: true, lastSuccess: ago(time.Minute), firstAttempt: ago(time.Hour)}, StateOK},
		{"fetched, last poll failed", stateFacts{held: true, lastSuccess: ago(time.Minute), failures: 4, firstAttempt: ago(time.Hour)}, StateFailing},
		{"fetched, no success for 3 intervals", stateFacts{held: true, lastSuccess: ago(3*interval + time.Second), failures: 9, firstAttempt: ago(time.Hour)}, StateStale},
		{"fetched, exactly 3 intervals", stateFacts{held: true, lastSuccess: ago(3 * interval), failures: 9, firstAttempt: ago(time.Hour)}, StateFailing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.f
			f.interval = interval
			assert.Equal(t, tt.want, stateOf(f, now))
		})
	}
}
