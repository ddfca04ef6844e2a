package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loglimit"
	"github.com/trustbridge/trustbridge/internal/runall"
	"github.com/trustbridge/trustbridge/internal/server/admin"
	"github.com/trustbridge/trustbridge/internal/server/ha"
	"github.com/trustbridge/trustbridge/internal/server/hostcheck"
)

type serverOptions struct {
	trustDomain    string
	dataDir        string
	init           bool
	adminListen    string
	adminSocket    string
	adminHosts     []string
	adminConns     connLimits
	keyType        string
	caTTL          time.Duration
	workloadTTL    time.Duration
	maxWorkloadTTL time.Duration
	refreshHint    time.Duration
	caDir          string
	caDirPoll      time.Duration
	configPath     string
	auditLog       string
	logFormat      string
	logLevel       string
	bundle         bundleOptions
	federation     federationOptions
	grpc           grpcOptions
	kube           kubeOptions
	policy         policyOptions
	jwt            jwtKeyOptions
	upstream       upstreamOptions
	keys           keyManagerOptions
}

func newServerCmd(e env) *cobra.Command {
	var o serverOptions
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the trust domain: embedded CA with root rotation and an admin endpoint",
		Long: `Run trustbridge for one trust domain. The first start, in an empty --data-dir
or with --init, creates a self-signed root there; later starts reuse it. A
--data-dir that does not exist, or holds files but no CA state, is refused
without --init, so a mistyped path never bootstraps a new root. One server
per data directory: a second one fails at once, naming the first (its lock
file, trustbridge.lock, records its pid and start). Roots rotate on their own: a
successor is published at half the active root's life and signs only after
5 refresh hints, so federated peers always know a root before they meet a
certificate it signed.

The admin listener serves /healthz, /readyz, /metrics (Prometheus),
/v1/trust (JSON: the published roots, their state and fingerprints),
/v1/bundle (the SPIFFE bundle document https_spiffe peers need once, to
authenticate their first fetch), /v1/federation (every federated trust domain's polling state),
/v1/snapshot (JSON: every trusted trust domain, by which authorities,
since when, from where; what trustbridge audit reads) and /ui (the same as
a read-only status page). A request whose Host header names anything but
the listener's address, localhost or an --admin-allowed-hosts name gets
421 Misdirected Request, so a web page that rebinds its own name to this
address (DNS rebinding) cannot read it.`,
		Example: `  # first start of a trust domain: --init creates ./data and its root CA
  trustbridge server --trust-domain example.org --data-dir ./data --init
  # later starts reuse ./data (--init changes nothing then)
  trustbridge server --trust-domain example.org --data-dir ./data

  # federate with an https_web peer (Istio's form) and an https_spiffe peer
  # whose bundle its operator handed over (the fourth field)
  trustbridge server --trust-domain example.org --data-dir /var/lib/trustbridge \
    --federate 'web.example|https://web.example/bundle||east.example|https://east.example:8443/|spiffe://east.example/trustbridge/bundle-endpoint|east.example.json'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadServerConfig(cmd.Flags(), &o, os.Getenv); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			e, stopHUP := hupSignals(e)
			defer stopHUP()
			return runServer(ctx, e, o, nil)
		},
	}
	addServerFlags(cmd.Flags(), &o)
	return cmd
}

// loadServerConfig applies --config (flag > env > file > default) and the
// environment variables of flags left empty.
func loadServerConfig(f *pflag.FlagSet, o *serverOptions, getenv func(string) string) error {
	if o.configPath != "" {
		cf, err := applyConfigFile(f, o.configPath, getenv)
		if err != nil {
			return err
		}
		if cf.federation != nil {
			if o.federation.configFile != "" {
				return fmt.Errorf("config %s: a federation list and --federation-config do not combine; keep one", o.configPath)
			}
			o.federation.inline, o.federation.inlineFrom = cf.federation, o.configPath
		}
		o.policy.inline, o.policy.inlineFrom = cf.trustPolicy, o.configPath
		o.grpc.oidc.inline, o.grpc.oidc.inlineFrom = cf.oidc, o.configPath
	}
	if o.trustDomain == "" {
		o.trustDomain = getenv("TRUST_DOMAIN")
	}
	return nil
}

// addServerFlags registers every flag of trustbridge server.
func addServerFlags(f *pflag.FlagSet, o *serverOptions) {
	f.StringVar(&o.configPath, configFlag, "", "YAML file whose keys are these flags' names (trust-domain: example.org), plus a federation list in the --federation-config schema; flags and environment variables win over it (see docs/configuration.md; check it with trustbridge config check)")
	f.StringVar(&o.trustDomain, "trust-domain", "", "trust domain to serve, e.g. example.org (env TRUST_DOMAIN)")
	f.StringVar(&o.dataDir, "data-dir", "./data", "directory for CA state; keys are written mode 0600; refused if group- or other-writable or owned by another user (root excepted), or locked by another server (trustbridge.lock names it); with file storage, a missing directory is created (0700) only with --init")
	f.BoolVar(&o.init, initFlag, false, "first start with file storage: create --data-dir if missing, and new CA state in it even if it holds other files; without it a new CA is created only in an empty existing directory, so a mistyped path never bootstraps a new root. Harmless once the state exists (make run passes it every time); --storage kube needs none")
	f.StringVar(&o.adminListen, "admin-listen", "127.0.0.1:15014", "address of the admin HTTP listener (/healthz, /readyz, /metrics, /v1/trust)")
	adminLimits.addFlags(f, &o.adminConns, "admin", "the kubelet's probes and Prometheus, and a few browsers on /ui", serverMemoryNote(adminLimits))
	addAdminSocketFlag(f, &o.adminSocket)
	f.StringSliceVar(&o.adminHosts, adminHostsFlag, nil, "more host names the admin listener is reached by, NAME (any port) or NAME:PORT, e.g. trustbridge-admin.trustbridge-system.svc; a request naming another host gets 421 (a DNS rebinding defence). Its bind address (any IP literal when bound to 0.0.0.0 or ::) and localhost on a loopback or wildcard bind need no entry (repeatable)")
	f.StringVar(&o.keyType, "ca-key-type", string(ca.KeyECP256), "key type of new roots: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096")
	f.DurationVar(&o.caTTL, "ca-ttl", ca.DefaultConfig().RootTTL, "lifetime of new roots")
	f.DurationVar(&o.workloadTTL, "workload-ttl", 0, "default lifetime of workload certificates (default 24h, or --max-workload-ttl if lower)")
	f.DurationVar(&o.maxWorkloadTTL, "max-workload-ttl", ca.DefaultConfig().MaxWorkloadTTL, "longest lifetime a workload certificate may ask for")
	f.DurationVar(&o.refreshHint, "bundle-refresh-hint", ca.DefaultConfig().RefreshHint, "spiffe_refresh_hint published with the bundle; new roots wait 5 of these before signing")
	f.StringVar(&o.caDir, "ca-dir", "", "plug-in CA directory in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); reloaded on change, no rotation here")
	f.DurationVar(&o.caDirPoll, "ca-dir-poll-interval", ca.DefaultPluginPollInterval, "how often --ca-dir is checked for changes")
	addJWTKeyFlags(f, &o.jwt)
	addUpstreamFlags(f, &o.upstream)
	addKeyManagerFlags(f, &o.keys)
	addBundleFlags(f, &o.bundle)
	addFederationFlags(f, &o.federation)
	addGRPCFlags(f, &o.grpc)
	addKubeFlags(f, &o.kube)
	addPolicyFlags(f, &o.policy)
	f.StringVar(&o.auditLog, "audit-log", "", `hash-chained audit log of every trust change (JSON lines; verify with trustbridge audit log verify): a file path, "-" for standard output (default <data-dir>/audit.jsonl)`)
	f.StringVar(&o.logFormat, "log-format", "auto", "log format: auto (text on a terminal, JSON otherwise), json, text")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	for flag, env := range envVars {
		bindEnv(f, flag, env)
	}
}

// newLogger is the process's logger: JSON, or text on a terminal (auto),
// never writing a key twice in a record (logattr.UniqueKeys).
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	h, err := newLogHandler(w, format, level)
	if err != nil {
		return nil, err
	}
	return slog.New(logattr.UniqueKeys(h)), nil
}

func newLogHandler(w io.Writer, format, level string) (slog.Handler, error) {
	var lvl slog.Level
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
func runServer(ctx context.Context, e env, o serverOptions, ready chan<- string) error {
	logger, err := newLogger(e.err, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	routeKlog(logger)
	routeGRPCLog(logger)
	setMemoryLimit(logger)
	td, kt, err := checkServerBasics(o, logger)
	if err != nil {
		return err
	}
	lock, err := lockDataDir(o, logger)
	if err != nil {
		return err
	}
	defer func() { _ = lock.Release() }()
	reg := newRegistry()
	kube, err := setupKube(o.kube, o.grpc.kubeconfig, reg, logger)
	if err != nil {
		return err
	}
	keys, closeKeys, err := o.keys.open(os.Getenv, o.caDir, logger.With(logattr.Component, "key-manager"))
	if err != nil {
		return err
	}
	defer closeKeys()
	o.keys.manager = keys
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
	o.grpc.tokenLedger = kube.tokenLedger(o.dataDir)
	p := &serverParts{td: td, authority: authority, caChanges: authority.Subscribe(), kube: kube, replica: replica, trail: trail}
	if err := p.federate(o, reg, logger); err != nil {
		return err
	}
	if p.policy, err = setupPolicy(o, td, kube, trail, reg, logger); err != nil {
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
func (p *serverParts) serve(ctx context.Context, e env, o serverOptions, undo *cleanups, ready chan<- string, reg prometheus.Registerer, logger *slog.Logger) error {
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
	err = runall.Run(ctx, runners...)
	logger.Info("trustbridge server stopped")
	return err
}

// federate builds the federation: the trust store and the poller of the
// flags' and files' endpoints, the resources' controller, the changes made
// at run time; then puts the CA's bundle in the store.
func (p *serverParts) federate(o serverOptions, reg prometheus.Registerer, logger *slog.Logger) error {
	// Runtime federation (federation add) needs the poller running even
	// with no endpoints yet; with kube storage it comes from resources.
	o.federation.dynamic = o.kube.federationCRD || fileStorage(o)
	fed, err := setupFederation(o.federation, p.td, p.kube.lastKnownGood(o.dataDir), relayedTrustDomains(o.bundle), p.trail.federationEvent, reg, logger)
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
	socket    *adminSocket // nil without --admin-socket
	policy    *policySetup
}

// listen opens the bundle endpoint, the certificate service and the
// admin listener. The listeners are the runners' to close once they run;
// until then the returned clean-ups close them, in reverse order, also
// when listen fails part way.
func (p *serverParts) listen(o serverOptions, e env, reg *prometheus.Registry, logger *slog.Logger) (*cleanups, error) {
	undo := &cleanups{}
	var err error
	if o.bundle.listen != "" {
		if p.ep, err = setupBundleEndpoint(o.bundle, p.td, o.dataDir, o.workloadTTL, o.refreshHint, p.authority, p.fed, reg, logger); err != nil {
			return undo, err
		}
		undo.add(func() { _ = p.ep.ln.Close() })
	}
	o.grpc.access = p.policy.sdsAccess
	if p.gs, err = setupGRPC(o.grpc, p.td, o.workloadTTL, o.maxWorkloadTTL, p.authority, p.fed, reg, logger); err != nil {
		return undo, err
	}
	undo.add(p.gs.close)
	ln, hosts, err := listenAdmin(o, reg, logger)
	if err != nil {
		return undo, err
	}
	undo.add(func() { _ = ln.Close() })
	p.adminLn = ln
	cfg := adminConfig(p.authority, reg, p.fed, p.crd, p.ep, replicaOf(p.kube).at(e.now), p.policy)
	if p.gs != nil && p.gs.oidc != nil {
		cfg.Issuers = p.gs.oidc.Status
	}
	h := admin.New(cfg)
	p.adminSrv = newAdminServer(hosts.Wrap(h), logger)
	if p.socket, err = listenAdminSocket(o.adminSocket, h, logger); err != nil {
		return undo, err
	}
	undo.add(p.socket.close)
	return undo, nil
}

// runners lists everything the server runs until it stops: the admin
// listener, the CA's follower, the CA and the federation poller (under
// leader election with kube), the bundle endpoint and the gRPC services.
func (p *serverParts) runners(reg prometheus.Registerer, logger *slog.Logger) ([]func(context.Context) error, error) {
	runners := []func(context.Context) error{
		func(ctx context.Context) error { return serveAdmin(ctx, p.adminSrv, p.adminLn) },
		func(ctx context.Context) error { return followCA(ctx, p.authority, p.caChanges, p.fed, p.trail) },
	}
	runners = append(runners, p.socket.runners()...)
	if p.kube != nil {
		kr, err := p.kube.wire(p.td, p.fed, p.crd, reg, logger)
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
	return append(runners, p.gs.parts()...), nil
}

// newRegistry is a process's metrics registry (server and agent), with
// the Go runtime's and the process's collectors and the build info.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg)
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
func checkServerBasics(o serverOptions, logger *slog.Logger) (spiffeid.TrustDomain, ca.KeyType, error) {
	var kt ca.KeyType
	if o.trustDomain == "" {
		return spiffeid.TrustDomain{}, kt, errors.New("--trust-domain (or TRUST_DOMAIN) is required")
	}
	td, err := bundledoc.TrustDomainName(o.trustDomain)
	if err != nil {
		return td, kt, fmt.Errorf("--trust-domain %q: %w", o.trustDomain, err)
	}
	kt, err = ca.ParseKeyType(o.keyType)
	if err != nil {
		return td, kt, fmt.Errorf("--ca-key-type: %w", err)
	}
	if err := checkStorageFlags(o); err != nil {
		return td, kt, err
	}
	if err := checkListenerLimits(o); err != nil {
		return td, kt, err
	}
	if err := prepareDataDir(o); err != nil {
		return td, kt, err
	}
	if o.refreshHint < time.Minute || o.refreshHint > 24*time.Hour {
		logger.Warn("unusual --bundle-refresh-hint; peers poll this often and new roots wait 5 of these before signing", logattr.RefreshHint, o.refreshHint)
	}
	return td, kt, nil
}

// newAuthority builds the CA from the flags: its state in the data
// directory or, with kube, in Kubernetes, and a plug-in directory's roots
// when --ca-dir is set.
func newAuthority(o serverOptions, td spiffeid.TrustDomain, kt ca.KeyType, kube *kubeSetup, reg prometheus.Registerer, logger *slog.Logger) (*ca.Authority, error) {
	var plugin *ca.PluginWatcher
	if o.caDir != "" {
		plugin = ca.NewPluginWatcher(o.caDir, td, clock.RealClock{}, o.caDirPoll, logger.With(logattr.Component, "ca-dir"))
	}
	zone, err := workloadDNSZone(o.grpc, td)
	if err != nil {
		return nil, err
	}
	caCfg := ca.Config{
		TrustDomain:    td,
		DataDir:        o.dataDir,
		KeyType:        kt,
		RootTTL:        o.caTTL,
		RefreshHint:    o.refreshHint,
		WorkloadTTL:    o.workloadTTL,
		MaxWorkloadTTL: o.maxWorkloadTTL,
		Logger:         logger.With(logattr.Component, "ca"),
		Registerer:     reg,
		Plugin:         plugin,
		// Roots leave room for downstream intermediates only when some
		// downstream may ask (--downstream-allow).
		SignsIntermediates: len(o.grpc.downstream.allow) > 0,
		// The DNS names downstream intermediates may vouch for, and
		// those an upstream's intermediate must let us issue.
		WorkloadDNSZone:      zone,
		DownstreamDNSDomains: o.grpc.downstream.dnsDomains,
		ServingDNSNames:      servingDNSNames(o.grpc),
		Keys:                 o.keys.manager,
		RequireHSM:           o.keys.requireHSM,
	}
	if err := o.jwt.apply(&caCfg); err != nil {
		return nil, err
	}
	o.upstream.kubeconfig = o.grpc.kubeconfig
	if err := applyUpstream(o.upstream, o.caDir, &caCfg, logger.With(logattr.Component, "upstream")); err != nil {
		return nil, err
	}
	kube.caConfig(&caCfg)
	return ca.New(caCfg)
}

// listenAdmin opens the admin listener and its Host check, which guards
// /v1/* and /ui from a browser whose page re-resolved its own name to this
// address (DNS rebinding).
func listenAdmin(o serverOptions, reg prometheus.Registerer, logger *slog.Logger) (net.Listener, *hostcheck.Checker, error) {
	ln, err := adminLimits.listen(o.adminListen, o.adminConns, reg, logger)
	if err != nil {
		return nil, nil, err
	}
	hosts, err := adminHostCheck(ln.Addr().String(), o.adminHosts, misdirected(reg, logger))
	if err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	return ln, hosts, nil
}

// newAdminServer is the admin listener's HTTP server, with its timeouts.
// net/http's own errors (a failed accept, a handler's panic) go to
// logger, in its format, not as text through the log package.
func newAdminServer(h http.Handler, logger *slog.Logger) *http.Server {
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

// adminHostsFlag names the admin listener's allowed host names.
const adminHostsFlag = "admin-allowed-hosts"

// adminHostCheck is the Host check of the admin listener bound to listen;
// onRefuse (may be nil) hears of each refusal.
func adminHostCheck(listen string, allowed []string, onRefuse func(*http.Request)) (*hostcheck.Checker, error) {
	c, err := hostcheck.New(hostcheck.Config{Listen: listen, Allowed: allowed, Flag: "--" + adminHostsFlag, OnRefuse: onRefuse})
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", adminHostsFlag, err)
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
	lim := loglimit.NewDefault()
	return func(r *http.Request) {
		refused.Inc()
		logger.Log(r.Context(), lim.Level(slog.LevelWarn), "admin request refused: Host is not a name of this listener; list it with --"+adminHostsFlag+" if it is yours",
			"host", r.Host, logattr.Address, r.RemoteAddr, "path", r.URL.Path)
	}
}

// serveAdmin serves the admin listener until ctx is done.
func serveAdmin(ctx context.Context, srv *http.Server, ln net.Listener) error {
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
func followCA(ctx context.Context, a *ca.Authority, changes <-chan struct{}, fed *federationSetup, trail *auditTrail) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
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
		Warning: a.Warning,
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
