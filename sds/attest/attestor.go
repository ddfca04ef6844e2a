package attest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// Defaults.
const (
	DefaultProcRoot      = "/proc"
	DefaultMaxBinarySize = 512 << 20
)

// Log attribute keys logattr does not have.
const (
	attrPID    = "pid"
	attrUID    = "uid"
	attrGID    = "gid"
	attrReason = "reason"
)

// PodLookup finds the pod and container a caller's cgroups name. Pods is
// the one this package provides.
type PodLookup interface {
	Lookup(ctx context.Context, podUID, containerID string) (KubernetesFacts, error)
}

// PodLookupFunc adapts a function to PodLookup.
type PodLookupFunc func(ctx context.Context, podUID, containerID string) (KubernetesFacts, error)

// Lookup calls f.
func (f PodLookupFunc) Lookup(ctx context.Context, podUID, containerID string) (KubernetesFacts, error) {
	return f(ctx, podUID, containerID)
}

// Config configures an Attestor. The zero value attests unix facts from
// /proc, without binary digests or Kubernetes lookups.
type Config struct {
	// ProcRoot is where the host's proc filesystem is mounted (an agent
	// in a container with the host's /proc elsewhere); default /proc.
	// The agent must share the host's pid namespace.
	ProcRoot string
	// Pods looks up the pod of a caller in one; nil leaves its
	// Kubernetes facts at the pod UID and container ID.
	Pods PodLookup
	// Binary adds the caller's binary path and SHA-256 to its facts,
	// reading the whole binary on every attestation.
	Binary bool
	// MaxBinarySize bounds the binary Binary hashes; a larger one is
	// refused. Default DefaultMaxBinarySize.
	MaxBinarySize int64
	// Logger gets refusals, rate limited; nil discards.
	Logger *slog.Logger
	// Registerer gets trustbridge_agent_attestation_failures_total; nil
	// registers nowhere.
	Registerer prometheus.Registerer
}

// Attestor attests callers on sockets served with its Credentials.
type Attestor struct {
	cfg       Config
	failures  *prometheus.CounterVec
	refuseLog *ratelimit.LogLimiter
	digests   *digestCache
}

// New returns an Attestor for cfg, its metric registered.
func New(cfg Config) (*Attestor, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = DefaultProcRoot
	}
	if cfg.MaxBinarySize <= 0 {
		cfg.MaxBinarySize = DefaultMaxBinarySize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_agent_attestation_failures_total",
		Help: "Callers of the agent's sockets refused because they could not be attested, by reason.",
	}, []string{"reason"})
	for _, r := range reasons {
		failures.WithLabelValues(r.reason)
	}
	failures.WithLabelValues(Reason(nil))
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(failures); err != nil {
			return nil, fmt.Errorf("attest: registering metrics: %w", err)
		}
	}
	return &Attestor{cfg: cfg, failures: failures, refuseLog: ratelimit.NewDefaultLogLimiter(), digests: newDigestCache()}, nil
}

// Credentials returns gRPC server transport credentials for unix sockets
// that read each caller for Attest (see Caller). Serve only unix
// listeners with them: another kind of connection fails its handshake.
func (a *Attestor) Credentials() credentials.TransportCredentials {
	return &peerCredentials{procRoot: a.cfg.ProcRoot, binary: a.cfg.Binary}
}

// AttestPeer attests the caller of the RPC whose context ctx is.
func (a *Attestor) AttestPeer(ctx context.Context) (Facts, error) {
	c, _ := CallerFrom(ctx)
	return a.Attest(ctx, c)
}

// Attest returns c's facts, read from /proc and the API server, after
// checking that c is still the process that connected. A refusal wraps
// one of the Err sentinels (Status maps it for a server), is counted and
// logged.
func (a *Attestor) Attest(ctx context.Context, c *Caller) (Facts, error) {
	f, err := a.attest(ctx, c)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// The caller gave up (or its deadline passed) while a lookup
		// waited: not a refusal, and nothing to count.
		return Facts{}, err
	}
	a.refused(ctx, c, err)
	return Facts{}, err
}

func (a *Attestor) attest(ctx context.Context, c *Caller) (Facts, error) {
	if c == nil {
		return Facts{}, refusal(ErrNoCaller, "serve the socket with Attestor.Credentials")
	}
	if c.err != nil {
		return Facts{}, c.err
	}
	f, err := a.facts(ctx, c)
	// Checked after every read, also a failed one: a read that failed
	// because the process went away is reported as that.
	if aerr := c.alive(); aerr != nil {
		return Facts{}, aerr
	}
	return f, err
}

// facts reads everything about c's pid; only alive makes it c's.
func (a *Attestor) facts(ctx context.Context, c *Caller) (Facts, error) {
	f := Facts{PID: c.PID, Unix: UnixFacts{UID: c.UID, GID: c.GID, User: userName(c.UID), Group: groupName(c.GID)}}
	if a.cfg.Binary {
		var err error
		if f.Unix.BinaryPath, f.Unix.BinarySHA256, err = a.binary(c); err != nil {
			return Facts{}, err
		}
	}
	b, err := readBounded(a.procPath(c.PID, "cgroup"), maxCgroupSize)
	if err != nil {
		return Facts{}, refusal(ErrProcessGone, "pid %d: %w", c.PID, err)
	}
	place, err := parseCgroup(b)
	if err != nil {
		return Facts{}, refusal(ErrCgroup, "pid %d: %w", c.PID, err)
	}
	if !place.inPod() {
		return f, nil
	}
	k := KubernetesFacts{PodUID: place.podUID, ContainerID: place.containerID}
	if a.cfg.Pods != nil {
		if k, err = a.cfg.Pods.Lookup(ctx, place.podUID, place.containerID); err != nil {
			return Facts{}, err
		}
	}
	f.Kubernetes = &k
	return f, nil
}

func (a *Attestor) procPath(pid int32, name string) string {
	return filepath.Join(a.cfg.ProcRoot, strconv.Itoa(int(pid)), name)
}

// refused counts and logs a refusal; the log is rate limited, as a caller
// can provoke refusals at will.
func (a *Attestor) refused(ctx context.Context, c *Caller, err error) {
	reason := Reason(err)
	a.failures.WithLabelValues(reason).Inc()
	attrs := []any{attrReason, reason, logattr.Error, err}
	if c != nil {
		attrs = append(attrs, attrPID, c.PID, attrUID, c.UID, attrGID, c.GID)
	}
	a.cfg.Logger.Log(ctx, a.refuseLog.Level(slog.LevelWarn), "workload attestation refused", attrs...)
}

func userName(uid uint32) string {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return ""
	}
	return u.Username
}

func groupName(gid uint32) string {
	g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10))
	if err != nil {
		return ""
	}
	return g.Name
}
