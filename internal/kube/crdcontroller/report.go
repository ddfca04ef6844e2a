package crdcontroller

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/events"
)

// Limits on what goes into the API server, below its own: an event's note
// is refused past 1024 bytes, a condition's message past 32768.
const (
	maxNote    = 1000
	maxMessage = 32000
)

// Refused reports a refusal of obj (reason, note) once per generation,
// reason and note: every sync judges every resource again, and an event
// or log line per sync would bury the one that matters. last holds, per
// resource name, the refusal last reported; the caller deletes a name
// once the resource is valid or gone. Refused records a Warning event
// (action "Apply") when recorder is set and returns whether this refusal
// is new, so the caller logs it in its own words.
func Refused(last map[string]string, recorder events.EventRecorder, obj *unstructured.Unstructured, reason, note string) bool {
	name := obj.GetName()
	key := fmt.Sprintf("%d/%s/%s", obj.GetGeneration(), reason, note)
	if last[name] == key {
		return false
	}
	last[name] = key
	if recorder != nil {
		recorder.Eventf(obj, nil, corev1.EventTypeWarning, reason, "Apply", "%s", Truncate(note, maxNote))
	}
	return true
}

// SetCondition sets cond in *conds with its message cut to what the API
// server takes. Its LastTransitionTime is now (at the second the API
// server stores) unless old, the status as read, has the condition with
// the same status: then the transition is old's, so that rewriting a
// status does not move it.
func SetCondition(conds *[]metav1.Condition, old []metav1.Condition, cond metav1.Condition, now time.Time) {
	cond.Message = Truncate(cond.Message, maxMessage)
	cond.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
	if prev := meta.FindStatusCondition(old, cond.Type); prev != nil && prev.Status == cond.Status {
		cond.LastTransitionTime = prev.LastTransitionTime
	}
	meta.SetStatusCondition(conds, cond)
}

// Truncate cuts s to n bytes, marking the cut with "…".
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
