package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/agentapi"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/health"
	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/flagenv"
)

// Defaults of the agent's paths: Istio's, relative to the working
// directory as the Istio agent's are, so that a sidecar with the usual
// volume mounts works unchanged.
const (
	defaultSDSSocket = "./var/run/secrets/workload-spiffe-uds/socket"
	// defaultWorkloadSocket is the SPIFFE Workload API's socket: beside
	// the SDS socket, in the directory Istio shares with the workload.
	defaultWorkloadSocket = "./var/run/secrets/workload-spiffe-uds/" + workloadSocketName
	workloadSocketName    = "workload-api.sock"
	defaultCredentialsDir = "./var/run/secrets/workload-spiffe-credentials"
)

func newAgentCmd(e cli.Env) *cobra.Command {
	var (
		o           agent.Config
		outputCerts *cli.OldName
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Node agent: serve a workload's certificate and the federated trust to Envoy over SDS on a unix socket",
		Long: `Run next to a workload's Envoy and serve it, over the Envoy Secret Discovery
Service on a unix socket (--sds-socket, mode 0600), its certificate
("default") and validation contexts ("ROOTCA", "ALL", "spiffe://<td>").
The decision flow is the Istio agent's:

 1. an SDS server already answers on --sds-socket: nothing to do, exit 0;
 2. without --ca-addr, or with --file-mounted-certs: serve cert-chain.pem,
    key.pem and root-cert.pem of --credentials-dir, and push again
    whenever they change (with --ca-addr and no --credentials-dir given,
    files in the default directory are served too, as Istio's agent
    prefers mounted credentials to its CA). root-cert.pem holds
    the roots of the workload's own trust domain and nothing else (a root
    naming another trust domain there is refused); federated trust comes
    only from bundle.spiffe.json next to it, a SPIFFE bundle map, each
    root trusted for the trust domain it is listed under (trustbridge ca
    request writes both files);
 3. otherwise generate a key here (it never leaves the node), ask the
    certificate service at --ca-addr for a certificate (trusting
    --root-cert for the server; authenticating with a still valid
    certificate in --credentials-dir, else in --prov-cert, else with the
    token in --token-file), keep it in --credentials-dir when that was
    given (nothing is written otherwise), renew it at
    --secret-grace-period-ratio of its lifetime, and relay
    the validation contexts from the server's own SDS stream, so a
    federation change reaches Envoy as soon as the server has it. Until
    that stream delivers, Envoy gets the trust fetched with the first
    certificate (ROOTCA and ALL, per trust domain); --root-cert is only
    ever used to verify the server.

Envoy's SDS config points at the socket, e.g. a static cluster
"sds-grpc" with a pipe address of the socket path.

For one workload, ROOTCA is the local trust domain's roots by default
(--rootca local), as Istio's agent serves it. Istio's sidecars only ever ask for ROOTCA to
verify peers, so to let them verify federated peers run with --rootca
spiffe: ROOTCA is then what ALL is, Envoy's SPIFFE certificate validator
(envoy.tls.cert_validator.spiffe) with every trust domain the trust
policy grants the workload and its peer limits (one trusted_ca for an
Envoy whose node metadata sets disable_spiffe_cert_validation), as SPIRE's
agent serves it with default_all_bundles_name = "ROOTCA". A node agent
(--node) serves it so by default.

With --node the agent is its node's identity provider (one per node, a
DaemonSet with hostPID): the socket is open to every local user, and
each process that connects is attested (pid, uid and gid from the
kernel, pinned against pid reuse; its pod from its cgroup and, through an
informer limited to --node-name, the API server), mapped to its SPIFFE ID
(--identity-map, by default the Istio form for pods) and served that
identity: its certificate, which the agent asks the server for as the
node with its --token-file (the server grants it only for a pod on this
node; the key never leaves the agent, one certificate per identity
shared by its processes, up to --max-identities), and the trust the
server's policy decided for that workload. A caller that cannot be
attested, that no rule maps, or that the server refuses gets
PermissionDenied with the reason; while the API server is unreachable
new callers get Unavailable. Open streams are attested again every
minute, so a process that moved, or an --identity-map edit, reaches them
within it. The Workload API socket (--workload-api-socket) serves each
caller its own identity the same way (mode 0666 too), with the bundles
its workload may trust whole and JWT-SVIDs of that identity, which the
server mints for the node acting for the workload.

The same identity and trust are served over the SPIFFE Workload API on
--workload-api-socket (mode 0600, or 0660 with
--workload-api-socket-group), for go-spiffe, java-spiffe, py-spiffe and
spiffe-helper: point them at it with SPIFFE_ENDPOINT_SOCKET=unix://<the
absolute path>, which the agent logs at start. With a CA, the federated
bundles come from the server's WatchBundles (as the trust policy allows
them to this workload) and JWT-SVIDs from its MintJWTSVIDs; while the
server is unreachable the last good bundles are served and the agent
warns (trustbridge_agent_bundles_connected 0). From credential files,
bundle.spiffe.json may carry JWT authorities, and JWT-SVIDs are not
available. 'trustbridge agent api fetch x509' (and fetch jwt, fetch bundles,
validate jwt) shows what a workload gets there, as spire-agent api does.

The istio-agent environment variables that mean the same thing set the
flags (a flag wins over its variable, which wins over the default):
CA_ADDR, CA_ROOT_CA, OUTPUT_CERTS, PROV_CERT, FILE_MOUNTED_CERTS,
SECRET_GRACE_PERIOD_RATIO, SECRET_TTL and TRUST_DOMAIN; each flag's help
names its variable and says where the meaning differs from Istio's. A
value that cannot be honoured is an error naming the variable.`,
		Example: `  # a workload on a VM: bootstrap with a token, keep and renew the certificate in ./creds
  trustbridge agent --ca-addr trustbridge.example.org:15012 --root-cert root-cert.pem \
      --token-file agent.token --credentials-dir ./creds --sds-socket ./sds.sock
  # the same, with the Workload API for a go-spiffe workload (SPIFFE_ENDPOINT_SOCKET=unix://$PWD/api.sock)
  trustbridge agent --ca-addr trustbridge.example.org:15012 --root-cert root-cert.pem \
      --token-file agent.token --sds-socket ./sds.sock --workload-api-socket ./api.sock
  # beside an Istio sidecar, which asks only for ROOTCA: serve it every trust domain the policy grants
  trustbridge agent --ca-addr trustbridge.example.org:15012 --root-cert root-cert.pem \
      --token-file agent.token --rootca spiffe
  # serve files another tool keeps up to date (cert-manager's csi-driver-spiffe, ca request)
  trustbridge agent --file-mounted-certs --credentials-dir /var/run/secrets/workload-spiffe-credentials
  # one agent per node (a DaemonSet with hostPID): each pod's processes get their own identity
  trustbridge agent --node --node-name "$NODE_NAME" --ca-addr trustbridge.trustbridge-system.svc:15012 \
      --root-cert /etc/trustbridge/root-cert.pem --token-file /var/run/secrets/tokens/trustbridge \
      --sds-socket /run/trustbridge/sockets/socket --identity-map /etc/trustbridge/identity-map.yaml
  # the same, and ztunnel brokers the node's pods (SPIFFE Broker API, SPIRE's Delegated Identity API)
  trustbridge agent --node --node-name "$NODE_NAME" --ca-addr trustbridge.trustbridge-system.svc:15012 \
      --root-cert /etc/trustbridge/root-cert.pem --token-file /var/run/secrets/tokens/trustbridge \
      --broker-socket /run/trustbridge/broker/broker.sock --broker-allow sa:istio-system/ztunnel
  # the istio-agent names, as in a pod spec written for it
  CA_ADDR=trustbridge.trustbridge-system.svc:15012 CA_ROOT_CA=/etc/trustbridge/root-cert.pem \
      OUTPUT_CERTS=/var/run/secrets/workload-spiffe-credentials trustbridge agent --token-file /var/run/secrets/tokens/trustbridge`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fromFlags(&o, cmd.Flags(), outputCerts, os.Getenv); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			e, stopHUP := hupSignals(e)
			defer stopHUP()
			return runAgent(ctx, e, o)
		},
	}
	outputCerts = cli.AddOldName(cmd, "output-certs", cli.CredentialsDirFlag)
	addAgentFlags(cmd.Flags(), &o)
	cmd.AddCommand(agentapi.NewCmd(e, defaultWorkloadSocket))
	cmd.AddCommand(health.NewAgentCmd(e, defaultSDSSocket))
	return cmd
}

// addAgentFlags registers the agent's flags and the istio-agent
// environment variables that set them.
func addAgentFlags(f *pflag.FlagSet, o *agent.Config) {
	f.StringVar(&o.Socket, "sds-socket", defaultSDSSocket, "unix socket to serve SDS on (created mode 0600; a stale socket is removed, anything else at the path is an error)")
	f.StringVar(&o.SocketGroup, "sds-socket-group", "", "group (name or id) that may also use the socket (mode 0660), e.g. Envoy's when it runs as another user")
	f.StringVar(&o.WorkloadSocket, "workload-api-socket", defaultWorkloadSocket, "unix socket to serve the SPIFFE Workload API on, for the same identity as SDS (created mode 0600, stale socket replaced like --sds-socket's; clients use SPIFFE_ENDPOINT_SOCKET=unix://<absolute path>). When --sds-socket is given and this flag is not, "+workloadSocketName+" in --sds-socket's directory. Empty: no Workload API")
	f.StringVar(&o.WorkloadSocketGroup, "workload-api-socket-group", "", "group (name or id) that may also use the Workload API socket (mode 0660), e.g. the workload's when it runs as another user than the agent")
	f.StringVar(&o.CredentialsDir, cli.CredentialsDirFlag, defaultCredentialsDir, "directory of the workload's cert-chain.pem, key.pem (0600), root-cert.pem (the local trust domain's roots only) and bundle.spiffe.json (federated trust, per trust domain). Without --ca-addr, or with --file-mounted-certs, the files there are served and watched; with --ca-addr, when given, the agent keeps its certificates there and a still valid one found at start authenticates instead of the token (nothing is written when not given). OUTPUT_CERTS, Istio's directory to write certificates to, sets it only with a CA: without one it is refused")
	f.BoolVar(&o.FileMounted, "file-mounted-certs", false, "serve the files in --credentials-dir and never ask a CA, even with --ca-addr. Istio's FILE_MOUNTED_CERTS reads ./etc/certs: pass --credentials-dir ./etc/certs for that layout")
	f.StringVar(&o.CAAddr, "ca-addr", "", "address (host:port) of a trustbridge server's --grpc-listen: the certificate service and its SDS (Istio's default, the discovery address, does not apply: unset means no CA)")
	f.StringVar(&o.RootCert, "root-cert", "", "PEM roots of the server's trust domain, trusted for the first connection to --ca-addr (later the server's own ROOTCA). Istio's CA_ROOT_CA=SYSTEM (the system's web roots) is refused: the server presents an X509-SVID, which no web root signs")
	f.StringVar(&o.TokenFile, "token-file", "", "file holding a Kubernetes service account token or a bootstrap token, re-read at every use")
	f.StringVar(&o.ProvCert, "prov-cert", "", "directory holding cert-chain.pem and key.pem of a provisioning certificate that authenticates the first request when --credentials-dir holds no valid one; only read")
	f.StringVar(&o.TrustDomain, "trust-domain", "", "trust domain of the workload and of the certificate service at --ca-addr, which must present spiffe://<trust-domain>"+server.GRPCServingPath+" (default: the one trust domain --root-cert names). Istio's agent puts it in its CSR; here the server decides the identity from how the agent authenticates")
	f.StringVar(&o.ServerID, "server-spiffe-id", "", "SPIFFE ID the server must present (default spiffe://<trust-domain>"+server.GRPCServingPath+")")
	f.Float64Var(&o.GraceRatio, "secret-grace-period-ratio", 0.5, "renew the certificate when this fraction of its lifetime has passed, in (0, 1)")
	f.DurationVar(&o.TTL, "ttl", 0, "certificate lifetime to ask for, whole seconds (default: the server's --workload-ttl; Istio's SECRET_TTL defaults to 24h)")
	f.StringVar(&o.RootCA, "rootca", "", "what SDS's ROOTCA holds: local, the local trust domain's roots (Istio's agent); spiffe, what ALL holds: Envoy's SPIFFE validator with every trust domain the trust policy grants the workload, with its peer limits, as SPIRE's agent with default_all_bundles_name = \"ROOTCA\". Istio's sidecars ask only for ROOTCA: they need spiffe to verify federated peers. Default: spiffe with --node (a node agent serves Istio's sidecars), local otherwise (unchanged for one workload)")
	f.DurationVar(&o.PollInterval, "credentials-poll-interval", time.Second, "how often --credentials-dir files are checked for changes")
	f.StringVar(&o.LogFormat, "log-format", "auto", "log format: auto (text on a terminal, JSON otherwise), json, text")
	f.StringVar(&o.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	addAgentAdminFlags(f, &o.Admin)
	addNodeFlags(f, &o.Node)
	for flag, env := range agentEnv {
		flagenv.Bind(f, flag, env)
	}
}

// addNodeFlags registers --node and the flags of node mode.
func addNodeFlags(f *pflag.FlagSet, n *agent.NodeConfig) {
	f.BoolVar(&n.Enabled, "node", false, "serve every workload of this node its own identity (one agent per node, as a DaemonSet): each process that opens --sds-socket is "+
		"attested (its pid, uid and gid from the kernel, its pod from its cgroup and the API server), mapped to a SPIFFE ID (--identity-map; by default "+
		"spiffe://<td>/ns/<namespace>/sa/<service account>) and served that identity's certificate, which the agent asks the server for as the node "+
		"(--token-file: the server grants it only for a pod on this node). The socket is then open to every local user (mode 0666): attestation is "+
		"its access control. A caller that cannot be attested, or that no rule maps, is refused with the reason")
	f.StringVar(&n.Name, "node-name", "", "this node's name (spec.nodeName of its pods), required with --node on Kubernetes: set NODE_NAME from the downward API")
	f.StringVar(&n.IdentityMap, "identity-map", "", "with --node: YAML file of rules mapping attested facts (namespace, service account, pod labels, unix uid, binary path) to a SPIFFE ID template, re-read when it changes (see docs/node-agent.md)")
	f.BoolVar(&n.IdentityMapCRD, "identity-map-crd", false, "with --node and a Kubernetes API server: add the rules of ClusterIdentityMapping resources (read only; deploy/base/identitymapping-crd.yaml) to --identity-map's, the rules the server checks this agent's requests against (its --identity-map-crd); no workload gets an identity until they were read")
	f.StringVar(&n.IdentityDefault, "identity-default", "istio", "with --node: what a workload no rule of --identity-map selects gets: istio (a pod gets spiffe://<td>/ns/<namespace>/sa/<service account>, a host process nothing) or none (nothing); the file's own default, when it sets one, wins")
	f.StringVar(&n.Kubeconfig, "kubeconfig", "", "with --node: kubeconfig of the API server to read this node's pods from (get, list and watch on pods); in a pod the in-cluster config is used, elsewhere callers are attested by their unix facts only")
	f.StringVar(&n.ProcRoot, "proc-root", "/proc", "with --node: where the host's /proc is mounted; the agent must share the host's pid namespace (hostPID) to read its callers' cgroups")
	f.BoolVar(&n.AttestBinary, "attest-binary", false, "with --node: add each caller's binary path and SHA-256 to its facts (reads the whole binary, up to 512 MiB, on every new connection), for rules that select by them")
	f.IntVar(&n.MaxIdentities, "max-identities", 0, "with --node: most workload identities held at once (one certificate each, shared by every process with that identity); 0 is SPIRE's agent's 1,000")
	f.StringVar(&n.BrokerSocket, "broker-socket", "", "with --node: serve brokers (Istio's ztunnel, Cilium) the identities of this node's workloads on this unix socket: the SPIFFE Broker API and SPIRE's Delegated Identity API, a workload named by pid, Pod or service account, in plaintext or mutual TLS (created mode 0600; brokers use SPIFFE_BROKER_SOCKET=unix://<absolute path>; the documented path is /run/trustbridge/broker/broker.sock, in a directory of its own). Needs --broker-allow. Empty: no broker socket (see docs/brokers.md)")
	f.StringVar(&n.BrokerSocketGroup, "broker-socket-group", "", "group (name or id) that may also connect to --broker-socket (mode 0660), e.g. the broker's when it runs as another user than the agent")
	f.StringArrayVar(&n.BrokerAllow, "broker-allow", nil, "with --broker-socket: a caller allowed to broker, by its attested identity: sa:<namespace>/<service account> (e.g. sa:istio-system/ztunnel), uid:<n>, or the SPIFFE ID the identity map gives it; repeat for several. Everyone else is refused")
}

// runAgent runs the agent of o with e's streams and SIGHUP.
func runAgent(ctx context.Context, e cli.Env, o agent.Config) error {
	o.Stdout, o.Stderr, o.HUP, o.Version = e.Out, e.Err, e.HUP, buildVersion()
	return agent.New(o).Run(ctx)
}
