package attest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

func TestStatusAndReason(t *testing.T) {
	tests := []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{refusal(ErrNoCaller, "x"), codes.PermissionDenied, "no_caller"},
		{refusal(ErrProcessGone, "x"), codes.PermissionDenied, "process_gone"},
		{refusal(ErrProcessReplaced, "x"), codes.PermissionDenied, "process_replaced"},
		{refusal(ErrCgroup, "x"), codes.PermissionDenied, "cgroup"},
		{refusal(ErrBinary, "x"), codes.PermissionDenied, "binary"},
		{refusal(ErrUnknownPod, "x"), codes.PermissionDenied, "unknown_pod"},
		{refusal(ErrUnknownContainer, "x"), codes.PermissionDenied, "unknown_container"},
		{refusal(ErrKubeUnavailable, "x: %w", errors.New("connection refused")), codes.Unavailable, "kube_unavailable"},
		{refusal(ErrInvalidPID, "x"), codes.InvalidArgument, "invalid_pid"},
		{refusal(ErrInvalidPodRef, "x"), codes.InvalidArgument, "invalid_pod_ref"},
		{refusal(ErrPodNotRunning, "x"), codes.PermissionDenied, "pod_not_running"},
		{fmt.Errorf("waiting: %w", context.Canceled), codes.Canceled, "other"},
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "other"},
		// Anything unknown is a denial, never a pass.
		{errors.New("a bug"), codes.PermissionDenied, "other"},
	}
	for _, tt := range tests {
		t.Run(tt.reason+"/"+tt.code.String(), func(t *testing.T) {
			s := status.Convert(Status(tt.err))
			assert.Equal(t, tt.code, s.Code())
			assert.Equal(t, tt.err.Error(), s.Message(), "the reason reaches the caller")
			assert.Equal(t, tt.reason, Reason(tt.err))
		})
	}
	assert.NoError(t, Status(nil))
	assert.Contains(t, refusal(ErrKubeUnavailable, "x: %w", errors.New("connection refused")).Error(),
		"attest: the pods of this node cannot be read from the API server: x: connection refused")
}

// Refusals are counted by reason (every reason present from the start)
// and logged, at Warn only within the rate limit.
func TestRefusalsCountedAndLogged(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	a := newAttestor(t, Config{Registerer: reg, Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	n, err := testutil.GatherAndCount(reg, "trustbridge_agent_attestation_failures_total")
	require.NoError(t, err)
	assert.Equal(t, len(reasons)+1, n, "one series per reason, and other")

	a.refuseLog = ratelimit.NewLogLimiter(0, 3) // three, whatever the speed
	for range 25 {
		_, err := a.Attest(context.Background(), nil)
		require.ErrorIs(t, err, ErrNoCaller)
	}
	assert.Equal(t, 25.0, testutil.ToFloat64(a.failures.WithLabelValues("no_caller")))
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 25)
	assert.Equal(t, 3, strings.Count(logs.String(), `"level":"WARN"`), "rate limited: the rest at debug")
	assert.Contains(t, lines[0], `"reason":"no_caller"`)
	assert.Contains(t, lines[0], `"error":"attest: no caller credentials on the connection`)

	_, err = New(Config{Registerer: reg})
	require.Error(t, err, "registering twice")
}

// A caller that gives up while its pod is waited for is not a refusal:
// not counted, not logged.
func TestCancelledNotCounted(t *testing.T) {
	var logs bytes.Buffer
	a := newAttestor(t, Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := &Caller{err: fmt.Errorf("attest: waiting for pod: %w", ctx.Err())}
	_, err := a.Attest(ctx, c)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, codes.Canceled, status.Code(Status(err)))
	assert.Equal(t, 0.0, testutil.ToFloat64(a.failures.WithLabelValues("other")))
	assert.Empty(t, logs.String())
}
