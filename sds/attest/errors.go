package attest

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Every error Attest, PinPID, Pods.Lookup and
// Pods.LookupPod return wraps exactly one of them (plus the cause and the input that failed), so a server can
// map it to a status and a metric can label it without parsing messages.
// Reason gives the stable label.
var (
	// ErrNoCaller: the connection carries no caller credentials (the
	// server was not built with Credentials, or not on a unix socket).
	ErrNoCaller = errors.New("no caller credentials on the connection")
	// ErrProcessGone: the calling process could not be found or read
	// (it exited, or its pid is not visible from here).
	ErrProcessGone = errors.New("the calling process cannot be inspected")
	// ErrProcessReplaced: the caller exited, or its pid now names another
	// process, between the handshake and the end of attestation.
	ErrProcessReplaced = errors.New("the calling process exited or was replaced during attestation")
	// ErrCgroup: /proc/<pid>/cgroup is unreadable, malformed, ambiguous,
	// or names a pod without a workload container in it.
	ErrCgroup = errors.New("cannot determine the caller's pod and container from its cgroups")
	// ErrBinary: the caller's binary could not be hashed (opt-in fact).
	ErrBinary = errors.New("cannot read the caller's binary")
	// ErrUnknownPod: no pod with the caller's pod UID runs on this node.
	ErrUnknownPod = errors.New("no pod with the caller's pod UID on this node")
	// ErrUnknownContainer: the pod has no container with the caller's
	// container ID (the sandbox, or a status that never caught up).
	ErrUnknownContainer = errors.New("the caller's container is not among the pod's containers")
	// ErrKubeUnavailable: the pods of this node are not known right now
	// (not yet listed, or the API server is unreachable). Retry later;
	// nothing is guessed meanwhile.
	ErrKubeUnavailable = errors.New("the pods of this node cannot be read from the API server")
	// ErrInvalidPID: a third party (a broker) named a process by a pid
	// that names none (zero or negative).
	ErrInvalidPID = errors.New("invalid pid")
	// ErrInvalidPodRef: a third party named a pod by neither its UID nor
	// its namespace and name.
	ErrInvalidPodRef = errors.New("invalid pod reference")
	// ErrPodNotRunning: the pod a third party named is terminating
	// (deletion requested) or has finished (phase Succeeded or Failed):
	// it gets no new identity, and it never comes back.
	ErrPodNotRunning = errors.New("the pod is terminating or has finished")
)

// reasons maps each sentinel to its stable label, in the order Reason
// checks them (the first match wins).
var reasons = []struct {
	err    error
	reason string
}{
	{ErrNoCaller, "no_caller"},
	{ErrProcessReplaced, "process_replaced"},
	{ErrProcessGone, "process_gone"},
	{ErrKubeUnavailable, "kube_unavailable"},
	{ErrCgroup, "cgroup"},
	{ErrBinary, "binary"},
	{ErrUnknownPod, "unknown_pod"},
	{ErrUnknownContainer, "unknown_container"},
	{ErrInvalidPID, "invalid_pid"},
	{ErrInvalidPodRef, "invalid_pod_ref"},
	{ErrPodNotRunning, "pod_not_running"},
}

// Reason returns a short stable label for an attestation error, for
// metric labels and logs: "no_caller", "process_replaced",
// "process_gone", "kube_unavailable", "cgroup", "binary", "unknown_pod",
// "unknown_container", "invalid_pid", "invalid_pod_ref",
// "pod_not_running", or "other" for anything else (a cancelled
// context, a bug).
func Reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}

// Status maps an attestation error to the gRPC status a server returns:
// Unavailable (with the reason) while the API server cannot be read, so a
// client retries; InvalidArgument for a malformed pid or pod reference a
// broker sent (ErrInvalidPID, ErrInvalidPodRef); Canceled or DeadlineExceeded for its own context; and
// PermissionDenied (with the reason) for everything else, including
// errors this package does not know, so that nothing unexpected becomes
// permission. A nil error is nil.
func Status(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrKubeUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, ErrInvalidPID), errors.Is(err, ErrInvalidPodRef):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return status.Error(codes.PermissionDenied, err.Error())
	}
}

// refusal wraps a sentinel with what failed and why; format may wrap the
// cause with %w too.
func refusal(sentinel error, format string, args ...any) error {
	return fmt.Errorf("attest: %w: "+format, append([]any{sentinel}, args...)...)
}
