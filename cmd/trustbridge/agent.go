package main

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/sds/agent"
)

type agentOptions struct {
	socket         string
	socketGroup    string
	credentialsDir string
	caAddr         string
	rootCert       string
	tokenFile      string
	outputCerts    string
	serverID       string
	graceRatio     float64
	ttl            time.Duration
	pollInterval   time.Duration
	logFormat      string
	logLevel       string
	admin          agentAdminOptions
}

// Defaults of the agent's paths: Istio's, relative to the working
// directory as the Istio agent's are, so that a sidecar with the usual
// volume mounts works unchanged.
const (
	defaultSDSSocket      = "./var/run/secrets/workload-spiffe-uds/socket"
	defaultCredentialsDir = "./var/run/secrets/workload-spiffe-credentials"
)

func newAgentCmd(e env) *cobra.Command {
	var o agentOptions
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Node agent: serve a workload's certificate and the federated trust to Envoy over SDS on a unix socket",
		Long: `Run next to a workload's Envoy and serve it, over the Envoy Secret Discovery
Service on a unix socket (--sds-socket, mode 0600), its certificate
("default") and validation contexts ("ROOTCA", "ALL", "spiffe://<td>").
The decision flow is the Istio agent's:

 1. an SDS server already answers on --sds-socket: nothing to do, exit 0;
 2. cert-chain.pem, key.pem and root-cert.pem are in --credentials-dir:
    serve them, and push again whenever they change. root-cert.pem holds
    the roots of the workload's own trust domain and nothing else (a root
    naming another trust domain there is refused); federated trust comes
    only from bundle.spiffe.json next to it, a SPIFFE bundle map, each
    root trusted for the trust domain it is listed under (trustbridge ca
    request writes both files);
 3. otherwise generate a key here (it never leaves the node), ask the
    certificate service at --ca-addr for a certificate (trusting
    --root-cert for the server; authenticating with the token in
    --token-file, or with a still valid certificate in --output-certs),
    renew it at --secret-grace-period-ratio of its lifetime, and relay
    the validation contexts from the server's own SDS stream, so a
    federation change reaches Envoy as soon as the server has it. Until
    that stream delivers, Envoy gets the trust fetched with the first
    certificate (ROOTCA and ALL, per trust domain); --root-cert is only
    ever used to verify the server.

Envoy's SDS config points at the socket, e.g. a static cluster
"sds-grpc" with a pipe address of the socket path.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			e, stopHUP := hupSignals(e)
			defer stopHUP()
			return runAgent(ctx, e, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.socket, "sds-socket", defaultSDSSocket, "unix socket to serve SDS on (created mode 0600; a stale socket is removed, anything else at the path is an error)")
	f.StringVar(&o.socketGroup, "sds-socket-group", "", "group (name or id) that may also use the socket (mode 0660), e.g. Envoy's when it runs as another user")
	f.StringVar(&o.credentialsDir, "credentials-dir", defaultCredentialsDir, "directory of pre-provisioned cert-chain.pem, key.pem and root-cert.pem (the local trust domain's roots only), plus bundle.spiffe.json (optional: federated trust, per trust domain); when the first three are there they are served and watched instead of asking a CA")
	f.StringVar(&o.caAddr, "ca-addr", "", "address (host:port) of a trustbridge server's --grpc-listen: the certificate service and its SDS")
	f.StringVar(&o.rootCert, "root-cert", "", "PEM roots of the server's trust domain, trusted for the first connection to --ca-addr (later the server's own ROOTCA)")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding a Kubernetes service account token or a bootstrap token, re-read at every use")
	f.StringVar(&o.outputCerts, "output-certs", "", "directory to write the certificate, key (0600), root-cert.pem (local roots) and bundle.spiffe.json (every trust domain, per trust domain) into; a still valid certificate found there at start authenticates instead of the token")
	f.StringVar(&o.serverID, "server-spiffe-id", "", "SPIFFE ID the server must present (default spiffe://<trust-domain>"+grpcServingPath+")")
	f.Float64Var(&o.graceRatio, "secret-grace-period-ratio", 0.5, "renew the certificate when this fraction of its lifetime has passed, in (0, 1)")
	f.DurationVar(&o.ttl, "ttl", 0, "certificate lifetime to ask for (default: the server's --workload-ttl)")
	f.DurationVar(&o.pollInterval, "credentials-poll-interval", time.Second, "how often --credentials-dir files are checked for changes")
	f.StringVar(&o.logFormat, "log-format", "auto", "log format: auto (text on a terminal, JSON otherwise), json, text")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	addAgentAdminFlags(f, &o.admin)
	return cmd
}

func runAgent(ctx context.Context, e env, o agentOptions) error {
	base, err := newLogger(e.err, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	// Each part names its component on the process's logger; one derived
	// from another's would carry both (the rotator's records said
	// "component" twice).
	logger := base.With(logattr.Component, "agent")
	if !(o.graceRatio > 0 && o.graceRatio < 1) {
		return fmt.Errorf("--secret-grace-period-ratio %v: want a number between 0 and 1", o.graceRatio)
	}
	if o.ttl < 0 || o.ttl%time.Second != 0 {
		return fmt.Errorf("--ttl %s: want a whole, positive number of seconds", o.ttl)
	}
	if o.pollInterval <= 0 {
		return fmt.Errorf("--credentials-poll-interval %s must be positive", o.pollInterval)
	}
	reg := newRegistry()

	cfg := agent.Config{
		SocketPath:     o.socket,
		SocketGroup:    o.socketGroup,
		CredentialsDir: o.credentialsDir,
		PollInterval:   o.pollInterval,
		Logger:         logger,
		Registerer:     reg,
	}
	if o.caAddr != "" {
		if o.rootCert == "" {
			return errors.New("--ca-addr needs --root-cert: the roots that vouch for the server on the first connection")
		}
		roots, err := readPEMCerts(o.rootCert)
		if err != nil {
			return fmt.Errorf("--root-cert: %w", err)
		}
		var serverID spiffeid.ID
		if o.serverID != "" {
			if serverID, err = spiffeid.FromString(o.serverID); err != nil {
				return fmt.Errorf("--server-spiffe-id %q: %w", o.serverID, err)
			}
		}
		cfg.Rotator = &agent.RotatorConfig{
			CAAddr:         o.caAddr,
			Roots:          roots,
			ServerID:       serverID,
			TokenFile:      o.tokenFile,
			OutputCertsDir: o.outputCerts,
			GraceRatio:     o.graceRatio,
			TTL:            o.ttl,
			Logger:         base.With(logattr.Component, "rotator"),
			Registerer:     reg,
		}
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	stopSide, err := startAgentSide(ctx, e, o.admin, a, reg, logger)
	if err != nil {
		return err
	}
	defer stopSide()
	err = a.Run(ctx)
	if errors.Is(err, agent.ErrAlreadyServing) {
		fmt.Fprintf(e.out, "an SDS server already answers on %s; not starting another (%v)\n", o.socket, err)
		logger.Info("SDS server already running; exiting", "socket", o.socket)
		return nil
	}
	return err
}
