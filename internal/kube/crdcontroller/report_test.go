package crdcontroller

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
)

// A refusal is reported once per generation, reason and note; the event's
// note is cut to what the API server takes.
func TestRefused(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	last := map[string]string{}
	obj := widget("a")
	obj.SetGeneration(1)
	long := strings.Repeat("x", 2000)
	steps := []struct {
		name       string
		generation int64
		reason     string
		note       string
		want       bool
	}{
		{"first", 1, "Invalid", long, true},
		{"again", 1, "Invalid", long, false},
		{"new note", 1, "Invalid", "spec.x", true},
		{"new reason", 1, "Conflict", "spec.x", true},
		{"new generation", 2, "Conflict", "spec.x", true},
	}
	for _, s := range steps {
		obj.SetGeneration(s.generation)
		assert.Equal(t, s.want, Refused(last, rec, obj, s.reason, s.note), s.name)
	}
	require.Len(t, rec.Events, 4)
	first := <-rec.Events
	assert.True(t, strings.HasPrefix(first, "Warning Invalid "+strings.Repeat("x", maxNote)+"…"), first)
	assert.Len(t, first, len("Warning Invalid ")+maxNote+len("…"))
	assert.True(t, Refused(map[string]string{}, nil, obj, "Invalid", "n"), "no recorder: only the answer")
}

func TestSetCondition(t *testing.T) {
	earlier := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	now := time.Date(2026, 2, 1, 0, 0, 0, 700_000_000, time.UTC)
	old := []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, LastTransitionTime: earlier}}
	for _, tc := range []struct {
		name   string
		status metav1.ConditionStatus
		want   time.Time
	}{
		{"same status keeps the transition", metav1.ConditionTrue, earlier.Time},
		{"a change moves it to now, in seconds", metav1.ConditionFalse, now.Truncate(time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conds []metav1.Condition
			SetCondition(&conds, old, metav1.Condition{Type: "Ready", Status: tc.status, Reason: "R", Message: strings.Repeat("m", maxMessage+5)}, now)
			got := meta.FindStatusCondition(conds, "Ready")
			require.NotNil(t, got)
			assert.True(t, tc.want.Equal(got.LastTransitionTime.Time), got.LastTransitionTime)
			assert.Equal(t, strings.Repeat("m", maxMessage)+"…", got.Message)
		})
	}
}

func TestTruncate(t *testing.T) {
	assert.Equal(t, "abc", Truncate("abc", 3))
	assert.Equal(t, "ab…", Truncate("abc", 2))
	assert.Empty(t, Truncate("", 0))
}
