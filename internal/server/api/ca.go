package api

import (
	"time"

	"github.com/trustbridge/trustbridge/ca"
)

// CAStatus is what audits need of the local CA beyond its authorities.
type CAStatus struct {
	// WorkloadTTLSeconds and MaxWorkloadTTLSeconds are the default and the
	// longest lifetime of the workload certificates it signs.
	WorkloadTTLSeconds    int64 `json:"workload_ttl_seconds"`
	MaxWorkloadTTLSeconds int64 `json:"max_workload_ttl_seconds"`
	// Upstream is set in upstream mode (--upstream).
	Upstream *UpstreamStatus `json:"upstream,omitempty"`
}

// UpstreamStatus is the health of the upstream authority that signs the
// local CA's intermediate.
type UpstreamStatus struct {
	Name string `json:"name"`
	// LastSuccess is when it last signed an intermediate.
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// LastError and LastErrorAt describe the last failed request;
	// Failures counts the failures since the last success, the first of
	// which was at FailingSince.
	LastError    string     `json:"last_error,omitempty"`
	LastErrorAt  *time.Time `json:"last_error_at,omitempty"`
	Failures     int        `json:"failures,omitempty"`
	FailingSince *time.Time `json:"failing_since,omitempty"`
	// Refused says the last failure was a refusal (the upstream said no,
	// or its answer failed our checks), which asking again does not mend
	// until a configuration changes; it is retried every 5 minutes.
	Refused bool `json:"refused,omitempty"`
	// NextAttempt is when the upstream is asked again after a failure.
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
}

// NewCAStatus is the snapshot's ca section: the lifetimes of the leaves
// the CA signs and, in upstream mode (up set), its upstream's health.
func NewCAStatus(workloadTTL, maxWorkloadTTL time.Duration, up *ca.UpstreamStatus) *CAStatus {
	st := &CAStatus{
		WorkloadTTLSeconds:    int64(workloadTTL / time.Second),
		MaxWorkloadTTLSeconds: int64(maxWorkloadTTL / time.Second),
	}
	if up != nil {
		st.Upstream = &UpstreamStatus{Name: up.Name, LastSuccess: optTime(up.LastSuccess),
			LastError: up.LastError, LastErrorAt: optTime(up.LastErrorAt), Failures: up.Failures,
			FailingSince: optTime(up.FailingSince), Refused: up.Refused, NextAttempt: optTime(up.NextAttempt)}
	}
	return st
}

// optTime is t in UTC, nil when zero (unknown).
func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
