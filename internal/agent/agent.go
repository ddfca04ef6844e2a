package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/trustbridge/trustbridge/internal/server"
	sdsagent "github.com/trustbridge/trustbridge/sds/agent"
)

// Config is trustbridge agent's configuration: what its flags and the
// istio-agent environment variables set (cmd/trustbridge fills it), and
// what the process gives the agent.
type Config struct {
	Socket      string
	SocketGroup string
	// WorkloadSocket is --workload-api-socket, "" for none.
	WorkloadSocket      string
	WorkloadSocketGroup string
	CredentialsDir      string
	// KeepCerts: --credentials-dir was given (flag, --output-certs or
	// OUTPUT_CERTS), so with a CA the agent keeps its certificates there.
	KeepCerts   bool
	FileMounted bool
	CAAddr      string
	RootCert    string
	TokenFile   string
	ProvCert    string
	TrustDomain string
	ServerID    string
	// RootCA is --rootca: what the socket's ROOTCA holds, "local" or
	// "spiffe" (sds.ParseRootCAMode).
	RootCA string
	// From names, per flag an environment variable set, that variable.
	From map[string]string
	// Typed names, per flag given by its deprecated name, that name.
	Typed        map[string]string
	GraceRatio   float64
	TTL          time.Duration
	PollInterval time.Duration
	LogFormat    string
	LogLevel     string
	Admin        AdminConfig
	// Node is --node and its flags: serve every workload of the node.
	Node NodeConfig

	// Stdout receives the note that an SDS server already answers;
	// Stderr the logs. nil: discarded.
	Stdout, Stderr io.Writer
	// HUP delivers SIGHUP, which the agent logs it ignores; nil: never.
	HUP <-chan os.Signal
	// Version is trustbridge's version, for trustbridge_build_info.
	Version string
}

// Agent is trustbridge agent: the node agent of sds/agent with what the
// process adds beside it (logs, metrics, the admin listener, SIGHUP).
type Agent struct {
	cfg Config
}

// New returns the agent of cfg; Run checks cfg and starts it.
func New(cfg Config) *Agent {
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	return &Agent{cfg: cfg}
}

// Run runs the agent until ctx is done, or returns nil at once when an SDS
// server already answers on its socket.
func (a *Agent) Run(ctx context.Context) error {
	return runAgent(ctx, env{out: a.cfg.Stdout, err: a.cfg.Stderr, hup: a.cfg.HUP}, a.cfg)
}

// env is what the agent takes from the process (Config's Stdout, Stderr
// and HUP).
type env struct {
	out, err io.Writer
	hup      <-chan os.Signal
}

// credentialsDirFlag names the flag of the directory the agent serves and
// keeps its certificates in, for errors.
const credentialsDirFlag = "credentials-dir"

// rootCAFlag names the flag of the ROOTCA mode, for errors.
const rootCAFlag = "rootca"

func runAgent(ctx context.Context, e env, o Config) error {
	base, err := server.NewLogger(e.err, o.LogFormat, o.LogLevel)
	if err != nil {
		return err
	}
	// Each part names its component on the process's logger; one derived
	// from another's would carry both (the rotator's records said
	// "component" twice).
	server.RouteGRPCLog(base)
	server.SetMemoryLimit(base)
	reg := server.NewRegistry(o.Version)
	cfg, err := o.AgentConfig(base, reg)
	if err != nil {
		return err
	}
	logger := cfg.Logger
	a, err := sdsagent.New(cfg)
	if err != nil {
		return err
	}
	// Decide "someone already serves" before opening anything beside the
	// agent: a second agent given the same --admin-listen would otherwise
	// fail on the port the first holds instead of exiting 0.
	if err := a.CheckSocket(ctx); err != nil {
		return alreadyServing(e, o, logger, err)
	}
	stopSide, err := StartSide(ctx, e.hup, o.Admin, a, reg, logger)
	if err != nil {
		return err
	}
	defer stopSide()
	// Run probes again: a server may have started since.
	return alreadyServing(e, o, logger, a.Run(ctx))
}

// alreadyServing turns sdsagent.ErrAlreadyServing into exit status 0 with a
// note, as Istio's agent does; other errors pass through.
func alreadyServing(e env, o Config, logger *slog.Logger, err error) error {
	if !errors.Is(err, sdsagent.ErrAlreadyServing) {
		return err
	}
	fmt.Fprintf(e.out, "an SDS server already answers on %s; not starting another (%v)\n", o.Socket, err)
	logger.Info("SDS server already running; exiting", "socket", o.Socket)
	return nil
}
