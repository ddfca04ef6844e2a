package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
	"github.com/trustbridge/trustbridge/internal/server/admin"
	"github.com/trustbridge/trustbridge/internal/server/flagenv"
	"github.com/trustbridge/trustbridge/internal/server/ha"
	"github.com/trustbridge/trustbridge/internal/server/hostcheck"
)

// Config is trustbridge server's configuration: what its flags, their
// environment variables and its --config file set (AddFlags and Load fill
// it from a flag set), and what the process gives the server. Each field
// before Stdout is the flag of its name (TrustDomain: --trust-domain,
// Bundle.Listen: --bundle-listen; docs/configuration.md lists them), with
// the flag's default when filled by AddFlags; a Config built by hand sets
// what it needs (zero durations and limits take the documented defaults
// where the flags' help says so).
type Config struct {
	TrustDomain    string
	DataDir        string
	Init           bool
	AdminListen    string
	AdminSocket    string
	AdminHosts     []string
	AdminConns     ConnLimits
	KeyType        string
	CATTL          time.Duration
	WorkloadTTL    time.Duration
	MaxWorkloadTTL time.Duration
	RefreshHint    time.Duration
	CADir          string
	CADirPoll      time.Duration
	ConfigPath     string
	AuditLog       string
	LogFormat      string
	LogLevel       string
	Bundle         BundleConfig
	Federation     FederationConfig
	GRPC           GRPCConfig
	Kube           KubeConfig
	Policy         PolicyConfig
	IdentityMap    IdentityMapConfig
	JWT            JWTKeyConfig
	Upstream       UpstreamConfig
	Keys           KeyManagerConfig

	// Stdout receives the start banner (with text logs) and the audit
	// log with --audit-log -; Stderr the logs. nil: discarded.
	Stdout, Stderr io.Writer
	// Now is the clock of snapshots and operator refreshes; nil: time.Now.
	Now func() time.Time
	// HUP delivers the signal to reload on (SIGHUP); nil: never.
	HUP <-chan os.Signal
	// Ready, when not nil, receives the admin listener's address once the
	// server serves.
	Ready chan<- string
	// Version is trustbridge's version, for the logs, the banner and
	// trustbridge_build_info; empty: the module's, else "dev".
	Version string
}

// AddFlags registers every flag of trustbridge server on f, each setting
// its field of c. The --config file's keys are these flags' names, and a
// reload reads the file again through them.
func (c *Config) AddFlags(f *pflag.FlagSet) { addServerFlags(f, c) }

// Load applies the --config file of f's --config flag (flag > environment
// variable > file > default) and the environment variables of flags left
// empty; getenv is os.Getenv but in tests.
func (c *Config) Load(f *pflag.FlagSet, getenv func(string) string) error {
	return loadServerConfig(f, c, getenv)
}

// Server is one trust domain's trustbridge server.
type Server struct {
	cfg Config
}

// New returns the server of cfg; Run checks cfg and starts it.
func New(cfg Config) *Server {
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Server{cfg: cfg}
}

// Run runs the server until ctx is done: the CA, the federation, the
// bundle endpoint, the certificate services and the admin listener.
func (s *Server) Run(ctx context.Context) error {
	e := env{out: s.cfg.Stdout, err: s.cfg.Stderr, now: s.cfg.Now, hup: s.cfg.HUP}
	return runServer(ctx, e, s.cfg, s.cfg.Ready)
}

// env is what the server takes from the process: streams, the clock and
// SIGHUP (Config's Stdout, Stderr, Now and HUP). Tests pass their own.
type env struct {
	in       io.Reader
	out, err io.Writer
	now      func() time.Time
	hup      <-chan os.Signal
}

// version is c.Version, else the module's version, else "dev".
func (c Config) version() string {
	if c.Version != "" {
		return c.Version
	}
	return buildVersion()
}

// buildVersion is the module's version, else "dev": the version of a
// build that did not set Config.Version.
func buildVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return "dev"
}

// loadServerConfig applies --config (flag > env > file > default) and the
// environment variables of flags left empty.
func loadServerConfig(f *pflag.FlagSet, o *Config, getenv func(string) string) error {
	if o.ConfigPath != "" {
		cf, err := applyConfigFile(f, o.ConfigPath, getenv)
		if err != nil {
			return err
		}
		if cf.federation != nil {
			if o.Federation.ConfigFile != "" {
				return fmt.Errorf("config %s: a federation list and --federation-config do not combine; keep one", o.ConfigPath)
			}
			o.Federation.inline, o.Federation.inlineFrom = cf.federation, o.ConfigPath
		}
		o.Policy.inline, o.Policy.inlineFrom = cf.trustPolicy, o.ConfigPath
		o.GRPC.OIDC.inline, o.GRPC.OIDC.inlineFrom = cf.oidc, o.ConfigPath
	}
	if o.TrustDomain == "" {
		o.TrustDomain = getenv("TRUST_DOMAIN")
	}
	return nil
}

// addServerFlags registers every flag of trustbridge server.
func addServerFlags(f *pflag.FlagSet, o *Config) {
	f.StringVar(&o.ConfigPath, configFlag, "", "YAML file whose keys are these flags' names (trust-domain: example.org), plus a federation list in the --federation-config schema; flags and environment variables win over it (see docs/configuration.md; check it with trustbridge config check)")
	f.StringVar(&o.TrustDomain, "trust-domain", "", "trust domain to serve, e.g. example.org (env TRUST_DOMAIN)")
	f.StringVar(&o.DataDir, "data-dir", "./data", "directory for CA state; keys are written mode 0600; refused if group- or other-writable or owned by another user (root excepted), or locked by another server (trustbridge.lock names it); with file storage, a missing directory is created (0700) only with --init")
	f.BoolVar(&o.Init, initFlag, false, "first start with file storage: create --data-dir if missing, and new CA state in it even if it holds other files; without it a new CA is created only in an empty existing directory, so a mistyped path never bootstraps a new root. Harmless once the state exists (make run passes it every time); --storage kube needs none")
	f.StringVar(&o.AdminListen, "admin-listen", "127.0.0.1:15014", "address of the admin HTTP listener (/healthz, /readyz, /metrics, /v1/trust)")
	AdminLimits.AddFlags(f, &o.AdminConns, "admin", "the kubelet's probes and Prometheus, and a few browsers on /ui", serverMemoryNote(AdminLimits))
	addAdminSocketFlag(f, &o.AdminSocket)
	f.StringSliceVar(&o.AdminHosts, AdminHostsFlag, nil, "more host names the admin listener is reached by, NAME (any port) or NAME:PORT, e.g. trustbridge-admin.trustbridge-system.svc; a request naming another host gets 421 (a DNS rebinding defence). Its bind address (any IP literal when bound to 0.0.0.0 or ::) and localhost on a loopback or wildcard bind need no entry (repeatable)")
	f.StringVar(&o.KeyType, "ca-key-type", string(ca.KeyECP256), "key type of new roots: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096")
	f.DurationVar(&o.CATTL, "ca-ttl", ca.DefaultConfig().RootTTL, "lifetime of new roots")
	f.DurationVar(&o.WorkloadTTL, "workload-ttl", 0, "default lifetime of workload certificates (default 24h, or --max-workload-ttl if lower)")
	f.DurationVar(&o.MaxWorkloadTTL, "max-workload-ttl", ca.DefaultConfig().MaxWorkloadTTL, "longest lifetime a workload certificate may ask for")
	f.DurationVar(&o.RefreshHint, "bundle-refresh-hint", ca.DefaultConfig().RefreshHint, "spiffe_refresh_hint published with the bundle; new roots wait 5 of these before signing")
	f.StringVar(&o.CADir, "ca-dir", "", "plug-in CA directory in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); reloaded on change, no rotation here")
	f.DurationVar(&o.CADirPoll, "ca-dir-poll-interval", ca.DefaultPluginPollInterval, "how often --ca-dir is checked for changes")
	addJWTKeyFlags(f, &o.JWT)
	addUpstreamFlags(f, &o.Upstream)
	addKeyManagerFlags(f, &o.Keys)
	addBundleFlags(f, &o.Bundle)
	addFederationFlags(f, &o.Federation)
	addGRPCFlags(f, &o.GRPC)
	addKubeFlags(f, &o.Kube)
	addPolicyFlags(f, &o.Policy)
	addIdentityMapFlags(f, &o.IdentityMap)
	f.StringVar(&o.AuditLog, "audit-log", "", `hash-chained audit log of every trust change (JSON lines; verify with trustbridge audit log verify): a file path, "-" for standard output (default <data-dir>/audit.jsonl)`)
	f.StringVar(&o.LogFormat, "log-format", "auto", "log format: auto (text on a terminal, JSON otherwise), json, text")
	f.StringVar(&o.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	for flag, env := range envVars {
		flagenv.Bind(f, flag, env)
	}
}

// NewLogger is the process's logger: JSON, or text on a terminal (auto),
// never writing a key twice in a record (logattr.UniqueKeys).
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	logger, _, err := newLevelLogger(w, format, level)
	return logger, err
}

// newLevelLogger is NewLogger with its level, which the admin API's
// /v1/log/level changes at run time.
func newLevelLogger(w io.Writer, format, level string) (*slog.Logger, *slog.LevelVar, error) {
	lvl := new(slog.LevelVar)
	h, err := newLogHandler(w, format, level, lvl)
	if err != nil {
		return nil, nil, err
	}
	return slog.New(logattr.UniqueKeys(h)), lvl, nil
}

func newLogHandler(w io.Writer, format, level string, lvl *slog.LevelVar) (slog.Handler, error) {
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	case "text":
		return slog.NewTextHandler(w, opts), nil
	case "auto":
		if isTerminal(w) {
			return slog.NewTextHandler(w, opts), nil
		}
		return slog.NewJSONHandler(w, opts), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want auto, json or text", format)
	}
}

// isTerminal says whether w is a character device: a person reading.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// runServer runs until ctx is done. ready, when not nil, receives the
// admin listener's address once the server serves.
func runServer(ctx context.Context, e env, o Config, ready chan<- string) error {
	// Before the CA exists: a root it bootstraps now signed nothing the
	// issuance ledger could have missed.
	started := e.now()
	logger, level, err := newLevelLogger(e.err, o.LogFormat, o.LogLevel)
	if err != nil {
		return err
	}
	routeKlog(logger)
	RouteGRPCLog(logger)
	defer runtime.KeepAlive(tuneMemory(logger))
	td, kt, err := checkServerBasics(o, logger)
	if err != nil {
		return err
	}
	lock, err := lockDataDir(o, logger)
	if err != nil {
		return err
	}
	defer func() { _ = lock.Release() }()
	reg := NewRegistry(o.version())
	kube, err := setupKube(o.Kube, o.GRPC.Kubeconfig, reg, logger)
	if err != nil {
		return err
	}
	keys, closeKeys, err := o.Keys.open(os.Getenv, o.CADir, logger.With(logattr.Component, "key-manager"))
	if err != nil {
		return err
	}
	defer closeKeys()
	o.Keys.manager = keys
	authority, err := newAuthority(o, td, kt, kube, reg, logger)
	if err != nil {
		return err
	}
	var replica *ha.Replica
	if kube != nil {
		if replica, err = kube.start(ctx, authority, logger); err != nil || replica == nil {
			return err // nil: stopped before the CA could sign
		}
		// Whatever returns early below must stop the background parts.
		defer func() { _ = replica.Stop() }()
	}
	trail, closeAudit, err := setupAudit(o, e, kube, reg, logger)
	if err != nil {
		return err
	}
	defer closeAudit()
	o.GRPC.tokenLedger = kube.tokenLedger(o.DataDir)
	p := &serverParts{td: td, authority: authority, caChanges: authority.Subscribe(), kube: kube, replica: replica, trail: trail,
		ledger: newIssuanceLedger(nowClock(e.now), started), taints: newCATaints(), level: level}
	p.taints.update(authority)
	if err := p.federate(o, reg, logger); err != nil {
		return err
	}
	if err := p.setupRules(o, reg, logger); err != nil {
		return err
	}

	undo, err := p.listen(o, e, reg, logger)
	defer undo.run()
	if err != nil {
		return err
	}
	return p.serve(ctx, e, o, undo, ready, reg, logger)
}

// serve announces the server, records the audit baseline and runs every
// part until ctx is done. The runners take over the listeners from undo.
func (p *serverParts) serve(ctx context.Context, e env, o Config, undo *cleanups, ready chan<- string, reg prometheus.Registerer, logger *slog.Logger) error {
	addr := p.adminLn.Addr().String()
	// The audit log's baseline, then the policy in force, before anyone
	// is told the server is up.
	p.trail.baseline(p.authority, p.fed)
	p.policy.recordStart()
	announce(e, o, p, addr, logger)
	if ready != nil {
		ready <- addr
	}
	runners, err := p.runners(reg, logger)
	if err != nil {
		return err
	}
	runners = append(runners, p.reloadRunner(e.hup, o, logger))
	undo.clear() // the runners own the listeners now
	err = loop.RunAll(ctx, runners...)
	logger.Info("trustbridge server stopped")
	return err
}

// federate builds the federation: the trust store and the poller of the
// flags' and files' endpoints, the resources' controller, the changes made
// at run time; then puts the CA's bundle in the store.
func (p *serverParts) federate(o Config, reg prometheus.Registerer, logger *slog.Logger) error {
	// Runtime federation (federation add) needs the poller running even
	// with no endpoints yet; with kube storage it comes from resources.
	o.Federation.dynamic = o.Kube.FederationCRD || fileStorage(o)
	fed, err := setupFederation(o.Federation, p.td, p.kube.lastKnownGood(o.DataDir), RelayedTrustDomains(o.Bundle), p.trail.federationEvent, reg, logger)
	if err != nil {
		return err
	}
	p.fed = fed
	if p.crd, err = p.kube.federationCRD(p.td, fed, reg, logger); err != nil {
		return err
	}
	if err := p.manage(o, logger); err != nil {
		return err
	}
	fed.store.Set(caSource, p.authority.Bundle())
	return nil
}

// setupRules builds the operator's rules: the trust policy (what
// workloads may trust) and the identity map (what node agents may get).
func (p *serverParts) setupRules(o Config, reg prometheus.Registerer, logger *slog.Logger) error {
	var err error
	if p.policy, err = setupPolicy(o, p.td, p.kube, p.trail, reg, logger); err != nil {
		return err
	}
	p.idmap, err = setupIdentityMap(o, p.td, p.kube, reg, logger)
	return err
}

// serverParts is what runServer built, for runners to start.
type serverParts struct {
	td        spiffeid.TrustDomain
	authority *ca.Authority
	caChanges <-chan struct{}
	kube      *kubeSetup
	replica   *ha.Replica // with kube only
	fed       *federationSetup
	crd       *crd.Controller // nil without --federation-crd
	trail     *auditTrail
	ep        *bundleEndpoint // nil without a bundle endpoint
	gs        *grpcEndpoint
	adminSrv  *http.Server
	adminLn   net.Listener
	socket    *adminSocket // nil without an admin socket
	policy    *policySetup
	idmap     *identityMapSetup // nil without an identity map
	// ledger counts what each CA authority signed that is still in use
	// (issuance_ledger.go).
	ledger *issuanceLedger
	// taints are the CA's tainted authorities for WatchBundles, kept by
	// followCA.
	taints *caTaints
	// level is the logs' level, which the admin API changes.
	level *slog.LevelVar
}

// listen opens the bundle endpoint, the certificate service and the
// admin listener. The listeners are the runners' to close once they run;
// until then the returned clean-ups close them, in reverse order, also
// when listen fails part way.
func (p *serverParts) listen(o Config, e env, reg *prometheus.Registry, logger *slog.Logger) (*cleanups, error) {
	undo := &cleanups{}
	var err error
	if o.Bundle.Listen != "" {
		if p.ep, err = setupBundleEndpoint(o.Bundle, p.td, o.JWT.Issuer, o.DataDir, o.WorkloadTTL, o.RefreshHint, p.authority, p.fed, reg, logger); err != nil {
			return undo, err
		}
		undo.add(func() { _ = p.ep.ln.Close() })
	}
	o.GRPC.access = p.policy.sdsAccess
	o.GRPC.jwtIssuer = o.JWT.Issuer
	o.GRPC.ledger, o.GRPC.taints = p.ledger, p.taints
	o.GRPC.identityMap, o.GRPC.identityMapReady = p.idmap.source(), p.idmap.ready()
	if p.gs, err = setupGRPC(o.GRPC, p.td, o.WorkloadTTL, o.MaxWorkloadTTL, p.authority, p.fed, reg, logger); err != nil {
		return undo, err
	}
	undo.add(p.gs.close)
	ln, hosts, err := ListenAdmin(o, reg, logger)
	if err != nil {
		return undo, err
	}
	undo.add(func() { _ = ln.Close() })
	p.adminLn = ln
	cfg := adminConfig(p.authority, reg, p.fed, p.crd, p.ep, replicaOf(p.kube).at(e.now), p.policy)
	cfg.IdentityMap = p.idmap.adminConfig()
	if p.gs != nil && p.gs.oidc != nil {
		cfg.Issuers = p.gs.oidc.Status
	}
	cfg.JWTIssuers = jwtIssuerStatuses(o.JWT.Issuer, p.td, p.ep)
	// The operator's authority changes, audited with who asked; the
	// trail's observer records the states they lead to.
	cfg.Authorities, cfg.Audit = p.authority, p.trail.record
	cfg.Signed, cfg.SignedIncomplete = p.ledger.signed, p.ledger.incomplete
	cfg.Mint = p.ledger.minter(p.authority)
	cfg.ClusterTrustBundles = p.kube.clusterTrustBundles
	cfg.Reserved, cfg.ReservedPath, cfg.ReservedDNSNames = p.ownIdentities(o)
	if p.ep != nil {
		cfg.Fetchers = p.ep.fetchers(p.td)
	}
	cfg.LogLevel, cfg.ReloadTokens = p.level, p.gs.reloadTokens()
	h := admin.New(cfg)
	p.adminSrv = NewAdminServer(hosts.Wrap(h), logger)
	if p.socket, err = listenAdminSocket(o, h, logger); err != nil {
		return undo, err
	}
	undo.add(p.socket.close)
	return undo, nil
}

// ownIdentities are what the server serves as, which the admin API
// refuses to mint: its SPIFFE IDs (all of /trustbridge, whatever is in use
// now, and a custom --bundle-endpoint-spiffe-id) and the DNS names of its
// listeners (--grpc-dns-names, the bundle endpoint's certificate, the
// admin listener's --admin-allowed-hosts).
func (p *serverParts) ownIdentities(o Config) ([]spiffeid.ID, string, []string) {
	ids := []spiffeid.ID{spiffeid.RequireFromPath(p.td, GRPCServingPath)}
	dns := slices.Clone(servingDNSNames(o.GRPC))
	if p.ep != nil {
		if !p.ep.id.IsZero() {
			ids = append(ids, p.ep.id)
		}
		dns = append(dns, p.ep.dnsNames...)
	}
	for _, h := range o.AdminHosts {
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		if h != "" && net.ParseIP(h) == nil {
			dns = append(dns, h)
		}
	}
	return ids, ownPath, dns
}

// runners lists everything the server runs until it stops: the admin
// listener, the CA's follower, the CA and the federation poller (under
// leader election with kube), the bundle endpoint and the gRPC services.
func (p *serverParts) runners(reg prometheus.Registerer, logger *slog.Logger) ([]func(context.Context) error, error) {
	runners := []func(context.Context) error{
		func(ctx context.Context) error { return ServeAdmin(ctx, p.adminSrv, p.adminLn) },
		func(ctx context.Context) error {
			return followCA(ctx, p.authority, p.caChanges, p.fed, p.trail, p.taints)
		},
	}
	runners = append(runners, p.socket.runners()...)
	if p.kube != nil {
		var extra []func(context.Context) error
		signer, err := p.podCertSigner(reg, logger)
		if err != nil {
			return nil, err
		}
		if signer != nil {
			extra = append(extra, signer.Run)
		}
		kr, err := p.kube.wire(p.td, p.fed, p.crd, reg, logger, extra...)
		if err != nil {
			return nil, err
		}
		runners = append(runners, p.replica.Run) // authority.Run is among them
		runners = append(runners, kr...)
	} else {
		runners = append(runners, p.authority.Run)
		if p.fed.poller != nil {
			runners = append(runners, p.fed.poller.Run)
		}
	}
	if p.ep != nil {
		runners = append(runners, p.ep.runners...)
	}
	runners = append(runners, p.policy.runners()...)
	runners = append(runners, p.idmap.runners()...)
	return append(runners, p.gs.parts()...), nil
}

// NewRegistry is a process's metrics registry (server and agent), with
// the Go runtime's and the process's collectors and the build info.
func NewRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, version)
	return reg
}

// cleanups is a stack of releases for a start that fails part way.
type cleanups []func()

func (c *cleanups) add(f func()) { *c = append(*c, f) }

// clear forgets the releases: what they would release is in use.
func (c *cleanups) clear() { *c = nil }

// run releases in reverse order of acquisition.
func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// checkServerBasics checks the flags every server needs before anything
// starts: the trust domain, the CA key type, storage, the data directory
// (created 0700 if missing and allowed), and warns about an unusual
// refresh hint.
func checkServerBasics(o Config, logger *slog.Logger) (spiffeid.TrustDomain, ca.KeyType, error) {
	var kt ca.KeyType
	if o.TrustDomain == "" {
		return spiffeid.TrustDomain{}, kt, errors.New("--trust-domain (or TRUST_DOMAIN) is required")
	}
	td, err := bundledoc.TrustDomainName(o.TrustDomain)
	if err != nil {
		return td, kt, fmt.Errorf("--trust-domain %q: %w", o.TrustDomain, err)
	}
	kt, err = ca.ParseKeyType(o.KeyType)
	if err != nil {
		return td, kt, fmt.Errorf("--ca-key-type: %w", err)
	}
	if err := checkStorageFlags(o); err != nil {
		return td, kt, err
	}
	if err := CheckListenerLimits(o); err != nil {
		return td, kt, err
	}
	// Before any state exists: a bad issuer must not leave a new CA.
	if err := o.JWT.check(); err != nil {
		return td, kt, err
	}
	if err := checkIssuerCertificate(o.Bundle, o.JWT.Issuer, td); err != nil {
		return td, kt, err
	}
	if err := checkFederationInputs(o, td); err != nil {
		return td, kt, err
	}
	if err := prepareDataDir(o); err != nil {
		return td, kt, err
	}
	if o.RefreshHint < time.Minute || o.RefreshHint > 24*time.Hour {
		logger.Warn("unusual --bundle-refresh-hint; peers poll this often and new roots wait 5 of these before signing", logattr.RefreshHint, o.RefreshHint)
	}
	return td, kt, nil
}

// newAuthority builds the CA from the flags: its state in the data
// directory or, with kube, in Kubernetes, and a plug-in directory's roots
// when --ca-dir is set.
func newAuthority(o Config, td spiffeid.TrustDomain, kt ca.KeyType, kube *kubeSetup, reg prometheus.Registerer, logger *slog.Logger) (*ca.Authority, error) {
	var plugin *ca.PluginWatcher
	if o.CADir != "" {
		plugin = ca.NewPluginWatcher(o.CADir, td, clock.RealClock{}, o.CADirPoll, logger.With(logattr.Component, "ca-dir"))
	}
	zone, err := workloadDNSZone(o.GRPC, td)
	if err != nil {
		return nil, err
	}
	caCfg := ca.Config{
		TrustDomain:    td,
		DataDir:        o.DataDir,
		KeyType:        kt,
		RootTTL:        o.CATTL,
		RefreshHint:    o.RefreshHint,
		WorkloadTTL:    o.WorkloadTTL,
		MaxWorkloadTTL: o.MaxWorkloadTTL,
		Logger:         logger.With(logattr.Component, "ca"),
		Registerer:     reg,
		Plugin:         plugin,
		// Roots leave room for downstream intermediates only when some
		// downstream may ask (--downstream-allow).
		SignsIntermediates: len(o.GRPC.Downstream.Allow) > 0,
		// The DNS names downstream intermediates may vouch for, and
		// those an upstream's intermediate must let us issue.
		WorkloadDNSZone:      zone,
		DownstreamDNSDomains: o.GRPC.Downstream.DNSDomains,
		ServingDNSNames:      servingDNSNames(o.GRPC),
		Keys:                 o.Keys.manager,
		RequireHSM:           o.Keys.requireHSM,
	}
	if err := o.JWT.apply(&caCfg); err != nil {
		return nil, err
	}
	o.Upstream.kubeconfig = o.GRPC.Kubeconfig
	if err := applyUpstream(o.Upstream, o.CADir, &caCfg, logger.With(logattr.Component, "upstream")); err != nil {
		return nil, err
	}
	kube.caConfig(&caCfg)
	a, err := ca.New(caCfg)
	if err != nil {
		return nil, kube.otherTrustDomain(err, o.DataDir, td)
	}
	return a, nil
}

// ListenAdmin opens the admin listener and its Host check, which guards
// /v1/* and /ui from a browser whose page re-resolved its own name to this
// address (DNS rebinding).
func ListenAdmin(o Config, reg prometheus.Registerer, logger *slog.Logger) (net.Listener, *hostcheck.Checker, error) {
	ln, err := AdminLimits.listen(o.AdminListen, o.AdminConns, reg, logger)
	if err != nil {
		return nil, nil, err
	}
	hosts, err := adminHostCheck(ln.Addr().String(), o.AdminHosts, misdirected(reg, logger))
	if err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	return ln, hosts, nil
}

// NewAdminServer is the admin listener's HTTP server, with its timeouts.
// net/http's own errors (a failed accept, a handler's panic) go to
// logger, in its format, not as text through the log package.
func NewAdminServer(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
}

// AdminHostsFlag names the admin listener's allowed host names.
const AdminHostsFlag = "admin-allowed-hosts"

// adminHostCheck is the Host check of the admin listener bound to listen;
// onRefuse (may be nil) hears of each refusal.
func adminHostCheck(listen string, allowed []string, onRefuse func(*http.Request)) (*hostcheck.Checker, error) {
	c, err := hostcheck.New(hostcheck.Config{Listen: listen, Allowed: allowed, Flag: "--" + AdminHostsFlag, OnRefuse: onRefuse})
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", AdminHostsFlag, err)
	}
	return c, nil
}

// misdirected counts the admin requests the Host check refuses and logs
// them at a bounded rate: a DNS rebinding attempt, or a probe or proxy
// that reaches the listener by a name --admin-allowed-hosts lacks.
func misdirected(reg prometheus.Registerer, logger *slog.Logger) func(*http.Request) {
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "trustbridge_admin_misdirected_requests_total",
		Help: "Admin listener requests refused with 421 because their Host header is not a name of the listener (see --admin-allowed-hosts).",
	})
	reg.MustRegister(refused)
	lim := ratelimit.NewDefaultLogLimiter()
	return func(r *http.Request) {
		refused.Inc()
		logger.Log(r.Context(), lim.Level(slog.LevelWarn), "admin request refused: Host is not a name of this listener; list it with --"+AdminHostsFlag+" if it is yours",
			"host", r.Host, logattr.Address, r.RemoteAddr, "path", r.URL.Path)
	}
}

// ServeAdmin serves the admin listener until ctx is done.
func ServeAdmin(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin listener: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// caSource names the CA's bundle in the trust store.
const caSource = "ca"

// followCA keeps the CA's bundle current in the trust store and records
// how its roots changed.
func followCA(ctx context.Context, a *ca.Authority, changes <-chan struct{}, fed *federationSetup, trail *auditTrail, taints *caTaints) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			taints.update(a)
			fed.store.Set(caSource, a.Bundle())
			trail.observeCA(a, false)
		}
	}
}

// adminHandler mounts the admin API on the server's parts.
func adminHandler(a *ca.Authority, reg *prometheus.Registry, fed *federationSetup, ctl *crd.Controller, ep *bundleEndpoint, rep *replica, pol *policySetup) http.Handler {
	return admin.New(adminConfig(a, reg, fed, ctl, ep, rep, pol))
}

// adminConfig is the admin API of the server's parts. rep, when set,
// names this replica and adds /v1/snapshot and /ui, which show fed's
// trust store.
func adminConfig(a *ca.Authority, reg *prometheus.Registry, fed *federationSetup, ctl *crd.Controller, ep *bundleEndpoint, rep *replica, pol *policySetup) admin.Config {
	cfg := admin.Config{
		TrustDomain: a.TrustDomain(), CA: a, JWT: a, Gatherer: reg,
		KeyManager: a.KeyStorage(), RequireHSM: a.RequireHSM(),
		WorkloadTTL: a.DefaultWorkloadTTL(), MaxWorkloadTTL: a.MaxWorkloadTTL(), Upstream: a.Upstream,
		Ready: func() error {
			if err := a.Ready(); err != nil {
				return err
			}
			return ep.Ready()
		},
		Warning:     a.Warning,
		Revocations: func() []bundledoc.Revocation { return caRevocations(a) },
	}
	if fed != nil {
		cfg.Origin = originOf(fed, ctl)
		if fed.poller != nil { // a nil *Poller in the interface would not be nil
			cfg.Federation = fed.poller
		}
		if rep != nil {
			cfg.Trust, cfg.Actor, cfg.IsLeader, cfg.Clock = fed.store, rep.actor, rep.leader, rep.clock
			cfg.Policy = pol.adminConfig()
		}
		fed.runtime.configure(&cfg)
	}
	return cfg
}

// replica names this server among its peers, in snapshots and the audit
// log: the leader-election identity with Kubernetes, else the host name.
type replica struct {
	actor  string
	leader func() bool // nil: a single server, always leading
	clock  clock.PassiveClock
}

func replicaOf(kube *kubeSetup) replica {
	if kube != nil {
		return replica{actor: kube.elector.Identity(), leader: kube.elector.IsLeader}
	}
	host, _ := os.Hostname()
	return replica{actor: host}
}

// at is r with the clock now, which dates its snapshots and paces
// operator refreshes.
func (r replica) at(now func() time.Time) *replica {
	r.clock = nowClock(now)
	return &r
}

// nowClock is env.now as a clock.PassiveClock.
type nowClock func() time.Time

func (c nowClock) Now() time.Time                  { return c() }
func (c nowClock) Since(t time.Time) time.Duration { return c().Sub(t) }
