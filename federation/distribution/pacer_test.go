package distribution

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPacer(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at    time.Duration // from t0
		wrote bool          // the write happened (else it failed)
		want  time.Duration // what wait says before it
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "burst goes at once", steps: []step{{0, true, 0}, {0, true, 0}, {0, true, 0}}},
		{name: "past the burst, wait for the next token", steps: []step{{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, false, time.Minute}}},
		{name: "part of a token already back", steps: []step{{0, true, 0}, {0, true, 0}, {0, true, 0}, {15 * time.Second, false, 45 * time.Second}}},
		{name: "tokens come back", steps: []step{{0, true, 0}, {0, true, 0}, {0, true, 0}, {time.Minute, true, 0}, {time.Minute, false, time.Minute}}},
		{name: "failed writes take nothing", steps: []step{{0, false, 0}, {0, false, 0}, {0, false, 0}, {0, false, 0}, {0, true, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(3, time.Minute)
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				assert.Equal(t, s.want, p.wait("ns", now), "step %d", i)
				if s.wrote {
					p.wrote("ns", now)
				}
			}
			assert.Zero(t, p.wait("other", t0), "namespaces are paced apart")
		})
	}

	t.Run("idle namespaces are forgotten", func(t *testing.T) {
		p := newPacer(3, time.Minute)
		for i := range minSweep {
			p.wrote(fmt.Sprint("ns-", i), t0)
		}
		assert.Len(t, p.byNS, minSweep)
		// A minute on, each of them is full again: the next namespace
		// written sweeps them out.
		p.wrote("busy", t0.Add(time.Minute))
		p.wrote("busy", t0.Add(time.Minute))
		p.wrote("new", t0.Add(time.Minute))
		assert.ElementsMatch(t, []string{"busy", "new"}, keys(p.byNS))
		assert.Equal(t, minSweep, p.sweepAt)
	})
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
