package ca

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca/castate"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestTimelineValidate(t *testing.T) {
	tl := timeline{RefreshHint: 5 * time.Minute, MaxWorkloadTTL: 90 * 24 * time.Hour}
	assert.NoError(t, tl.validate(8760*time.Hour), "defaults fit")
	err := tl.validate(100 * 24 * time.Hour)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "root TTL 2400h0m0s is too short")
	assert.ErrorContains(t, timeline{MaxWorkloadTTL: time.Hour}.validate(time.Hour), "refresh hint 0s is outside 1s to 720h0m0s")
	assert.ErrorContains(t, timeline{RefreshHint: time.Millisecond, MaxWorkloadTTL: time.Hour}.validate(time.Hour), "outside 1s")
	assert.ErrorContains(t, timeline{RefreshHint: 1000000 * time.Hour, MaxWorkloadTTL: time.Hour}.validate(time.Hour), "outside 1s to 720h0m0s",
		"a huge hint must not overflow into an activation in the past")
	assert.ErrorContains(t, timeline{RefreshHint: time.Minute}.validate(time.Hour), "maximum workload TTL must be positive")
	assert.ErrorContains(t, tl.validate(0), "root TTL must be positive")
}

func TestPlan(t *testing.T) {
	tl := timeline{RefreshHint: time.Minute, MaxWorkloadTTL: time.Hour}
	active := rootTimes{State: castate.StateActive, NotBefore: t0, NotAfter: t0.Add(24 * time.Hour)}
	prepared := rootTimes{State: castate.StatePrepared, NotBefore: t0.Add(12 * time.Hour), NotAfter: t0.Add(36 * time.Hour), PreparedAt: t0.Add(12 * time.Hour), PublishedAt: t0.Add(12 * time.Hour)}
	unpublished := prepared
	unpublished.PublishedAt = time.Time{}
	lateServed := prepared
	lateServed.PublishedAt = t0.Add(13 * time.Hour)
	retired := rootTimes{State: castate.StateRetired, NotBefore: t0.Add(-24 * time.Hour), NotAfter: t0.Add(time.Hour), RemoveAfter: t0.Add(30 * time.Minute)}

	tests := []struct {
		name      string
		now       time.Time
		roots     []rootTimes
		wantStep  step
		wantIndex int
		wantNext  time.Time
	}{
		{"nothing yet", t0, nil, stepBootstrap, -1, time.Time{}},
		{"young active root", t0.Add(time.Hour), []rootTimes{active}, stepNone, -1, t0.Add(12 * time.Hour)},
		{"half life reached", t0.Add(12 * time.Hour), []rootTimes{active}, stepPrepare, -1, time.Time{}},
		{"prepared, lead not yet over", t0.Add(12*time.Hour + 4*time.Minute), []rootTimes{active, prepared}, stepNone, -1, t0.Add(12*time.Hour + 5*time.Minute)},
		{"prepared, lead over", t0.Add(12*time.Hour + 5*time.Minute), []rootTimes{active, prepared}, stepActivate, 1, time.Time{}},
		{"retired root still needed", t0, []rootTimes{retired, active}, stepNone, -1, t0.Add(30 * time.Minute)},
		{"retired root done", t0.Add(30 * time.Minute), []rootTimes{retired, active}, stepRemove, 0, time.Time{}},
		{"removal comes before other steps", t0.Add(12 * time.Hour), []rootTimes{active, retired}, stepRemove, 1, time.Time{}},
		{"prepared without active still waits", t0.Add(12 * time.Hour), []rootTimes{prepared}, stepNone, -1, t0.Add(12*time.Hour + 5*time.Minute)},
		{"prepared without active after lead", t0.Add(13 * time.Hour), []rootTimes{prepared}, stepActivate, 0, time.Time{}},
		{"prepared elsewhere, never served, never activates", t0.Add(48 * time.Hour), []rootTimes{active, unpublished}, stepNone, -1, time.Time{}},
		{"the lead counts from publication, not preparation", t0.Add(13*time.Hour + 4*time.Minute), []rootTimes{active, lateServed}, stepNone, -1, t0.Add(13*time.Hour + 5*time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, index, next := tl.plan(tt.now, tt.roots)
			assert.Equal(t, tt.wantStep, step)
			assert.Equal(t, tt.wantIndex, index)
			assert.Equal(t, tt.wantNext, next)
		})
	}
}

func TestActivateAtKeepsTheLeadPromisedAtPreparation(t *testing.T) {
	// Prepared under a 10m hint, the server restarts with a 1m hint: peers
	// were told to come back in 10m, so activation waits for 5 × 10m.
	p := rootTimes{PreparedAt: t0, PublishedAt: t0, MinActivateAt: t0.Add(50 * time.Minute)}
	assert.Equal(t, t0.Add(50*time.Minute), timeline{RefreshHint: time.Minute}.activateAt(p))
	assert.Equal(t, t0.Add(100*time.Minute), timeline{RefreshHint: 20 * time.Minute}.activateAt(p))
}

func TestRemoveAfter(t *testing.T) {
	tl := timeline{RefreshHint: time.Minute, MaxWorkloadTTL: time.Hour}
	root := rootTimes{NotAfter: t0.Add(10 * time.Hour)}
	assert.Equal(t, t0.Add(time.Hour), tl.removeAfter(root, t0))
	assert.Equal(t, root.NotAfter, tl.removeAfter(root, t0.Add(9*time.Hour+30*time.Minute)), "never later than the root itself")
}

// TestPlanSimulation drives the plan through several rotations the way the
// scheduler does, jumping from event to event, and checks the timeline
// invariants at every step.
func TestPlanSimulation(t *testing.T) {
	tl := timeline{RefreshHint: time.Minute, MaxWorkloadTTL: time.Hour}
	rootTTL := 24 * time.Hour
	require.NoError(t, tl.validate(rootTTL))

	var roots []rootTimes
	now := t0
	activations := 0
	for i := 0; i < 100 && activations < 4; i++ {
		step, index, next := tl.plan(now, roots)
		switch step {
		case stepNone:
			require.True(t, next.After(now), "plan must move forward")
			now = next
		case stepBootstrap:
			roots = append(roots, rootTimes{State: castate.StateActive, NotBefore: now, NotAfter: now.Add(rootTTL), PreparedAt: now, PublishedAt: now})
		case stepPrepare:
			roots = append(roots, rootTimes{State: castate.StatePrepared, NotBefore: now, NotAfter: now.Add(rootTTL), PreparedAt: now, PublishedAt: now})
		case stepActivate:
			p := roots[index]
			require.False(t, now.Before(p.PreparedAt.Add(PublishLead*tl.RefreshHint)), "no root signs before it was published for %d hints", PublishLead)
			for j := range roots {
				if roots[j].State == castate.StateActive {
					old := roots[j]
					require.True(t, old.NotAfter.Sub(now) >= tl.MaxWorkloadTTL, "old root still outlives every leaf it signed")
					roots[j].State = castate.StateRetired
					roots[j].RemoveAfter = tl.removeAfter(old, now)
				}
			}
			roots[index].State = castate.StateActive
			activations++
		case stepRemove:
			require.False(t, now.Before(roots[index].RemoveAfter))
			roots = append(roots[:index], roots[index+1:]...)
		}
		actives := 0
		for _, r := range roots {
			if r.State == castate.StateActive {
				actives++
				assert.True(t, now.Before(r.NotAfter), "the active root is valid")
			}
		}
		assert.LessOrEqual(t, actives, 1)
	}
	assert.Equal(t, 4, activations, "four rotations after the bootstrap root")
}
