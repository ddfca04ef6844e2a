package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

// Defaults of Config, the Istio agent's paths relative to the working
// directory.
const (
	DefaultSocketPath     = "./var/run/secrets/workload-spiffe-uds/socket"
	DefaultCredentialsDir = "./var/run/secrets/workload-spiffe-credentials"
	DefaultPollInterval   = time.Second
)

// Names of the files of a pre-provisioned credential, as Istio names them.
const (
	CertChainFile = "cert-chain.pem"
	KeyFile       = "key.pem"
	RootCertFile  = "root-cert.pem"
	// BundleMapFile, optional, is a SPIFFE bundle map of the trust
	// domains the workload may trust besides its own.
	BundleMapFile = caclient.BundleMapFile
)

// ErrAlreadyServing means an SDS server already answers on the socket; Run
// returns it wrapped with the socket path and starts nothing.
var ErrAlreadyServing = errors.New("an SDS server already answers on the socket")

// Config configures an Agent.
type Config struct {
	// SocketPath is the unix socket SDS is served on; DefaultSocketPath
	// when empty.
	SocketPath string
	// SocketGroup, when set, is a group name or numeric id that may also
	// use the socket: the socket is then mode 0660 and owned by that
	// group; otherwise it is 0600.
	SocketGroup string
	// CredentialsDir holds pre-provisioned credential files;
	// DefaultCredentialsDir when empty. When it is also the Rotator's
	// OutputCertsDir, the files there are the Rotator's own: they
	// authenticate its first request and are renewed, never served as
	// pre-provisioned (they would go stale).
	CredentialsDir string
	// Rotator configures the certificate service client; nil means no CA
	// is configured, and then the credential files must be present.
	Rotator *RotatorConfig
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the agent's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// PollInterval is how often the credential files are checked;
	// DefaultPollInterval when zero.
	PollInterval time.Duration
	// WorkloadAPISocket, when set, is the unix socket the SPIFFE
	// Workload API is served on (sds/workload), for the same identity as
	// SDS; empty serves none.
	WorkloadAPISocket string
	// WorkloadAPISocketGroup is SocketGroup for the Workload API socket:
	// the workload's group, where SocketGroup is Envoy's.
	WorkloadAPISocketGroup string
	// RootCA is what the SDS socket's ROOTCA holds: sds.RootCALocal (the
	// zero value means it too) the local trust domain's roots, as Istio's
	// agent serves them; sds.RootCASPIFFE what ALL holds, Envoy's SPIFFE
	// validator with every trust domain the trust policy grants the
	// workload, as SPIRE's agent with default_all_bundles_name = "ROOTCA":
	// what Istio sidecars, which ask for ROOTCA only, need to verify
	// federated peers.
	RootCA sds.RootCAMode
	// AdoptCredentialsDir lets the Rotator write into CredentialsDir even
	// when it holds credentials trustbridge did not write (no
	// caclient.OwnerFile): the operator named it as the CA's output
	// directory (Istio's OUTPUT_CERTS), not as files to serve.
	AdoptCredentialsDir bool
	// Node, when set, makes the agent the identity provider of its node
	// (NodeConfig): each caller of the socket is attested and served its
	// own identity. It needs Rotator, with a token file: the node proves
	// itself with its token to ask for its workloads' certificates.
	Node *NodeConfig
}

// rotator is what the agent uses of *Rotator; tests substitute it.
type rotator interface {
	Init(ctx context.Context) error
	Cell() *sds.CredentialCell
	ID() spiffeid.ID
	Run(ctx context.Context) error
	ClientTLS() *tls.Config
	SetServerRoots(roots []*x509.Certificate)
	Trust() caclient.Trust
}

// Agent serves one workload's SDS on a unix socket. Build it with New.
type Agent struct {
	socketPath   string
	socketGID    int // -1: no group access
	wlSocket     string
	wlGID        int // -1: no group access
	credsDir     string
	pollInterval time.Duration
	clock        clock.WithTicker
	log          *slog.Logger
	reg          prometheus.Registerer
	metrics      *metrics

	caAddr string
	rot    rotator // nil: no CA configured
	// ownsCreds: credsDir is the Rotator's output directory, so step 2
	// of the decision flow does not apply to it.
	ownsCreds bool
	// adopt: take credsDir over even without the owner mark.
	adopt bool

	// rootCA is what the local SDS server's ROOTCA holds (Config.RootCA).
	rootCA sds.RootCAMode

	// probeTimeout bounds the check for a live SDS server on the socket.
	probeTimeout time.Duration
	// retry spaces the relay's reconnects.
	retry loop.Backoff

	// node: serve the node's workloads (NodeConfig), not one identity.
	node *NodeConfig

	running atomic.Bool
	// serving is set while the SDS socket is open: the agent has a
	// credential to serve (Ready).
	serving atomic.Bool
	// jwtIssuer is the server's issuer of our JWT-SVIDs, from
	// WatchBundles, which ValidateJWTSVID checks.
	jwtIssuer jwtIssuerCell
	// taints are the server's tainted authorities, from WatchBundles:
	// the Rotator, the node's identity cache and the JWT-SVID minters
	// follow them.
	taints taintCell
}

// New checks cfg and applies its defaults. It starts nothing; with
// cfg.Rotator set it builds the Rotator (NewRotator), so a bad CA
// configuration fails here rather than after the decision flow.
func New(cfg Config) (*Agent, error) {
	a := &Agent{
		socketPath:   cfg.SocketPath,
		socketGID:    -1,
		wlSocket:     cfg.WorkloadAPISocket,
		wlGID:        -1,
		credsDir:     cfg.CredentialsDir,
		pollInterval: cfg.PollInterval,
		adopt:        cfg.AdoptCredentialsDir,
		node:         cfg.Node,
		rootCA:       cfg.RootCA,
		clock:        cfg.Clock,
		log:          cfg.Logger,
		reg:          cfg.Registerer,
		probeTimeout: 2 * time.Second,
		retry:        loop.Backoff{Base: 250 * time.Millisecond, Max: 30 * time.Second, Jitter: retryJitter},
	}
	a.applyDefaults()
	if a.pollInterval < 0 {
		return nil, fmt.Errorf("agent: poll interval %s must be positive", a.pollInterval)
	}
	if _, err := sds.ParseRootCAMode(string(a.rootCA)); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err := a.resolveSockets(cfg); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.metrics = m
	if cfg.Rotator != nil {
		if err := a.useRotator(*cfg.Rotator, cfg.Registerer); err != nil {
			return nil, err
		}
	}
	if err := checkNode(cfg); err != nil {
		return nil, err
	}
	return a, nil
}

// applyDefaults fills in what Config leaves zero. A negative poll
// interval is left for New to refuse: no default repairs it.
func (a *Agent) applyDefaults() {
	if a.socketPath == "" {
		a.socketPath = DefaultSocketPath
	}
	if a.credsDir == "" {
		a.credsDir = DefaultCredentialsDir
	}
	if a.pollInterval == 0 {
		a.pollInterval = DefaultPollInterval
	}
	if a.rootCA == "" {
		a.rootCA = sds.RootCALocal
	}
	if a.clock == nil {
		a.clock = clock.RealClock{}
	}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// resolveSockets looks up the sockets' groups and refuses one path for
// both sockets, after applyDefaults so that an empty SocketPath is
// compared as the default it stands for: the second listener would
// replace the first one's socket.
func (a *Agent) resolveSockets(cfg Config) error {
	if cfg.SocketGroup != "" {
		gid, err := lookupGroup(cfg.SocketGroup)
		if err != nil {
			return fmt.Errorf("agent: socket group: %w", err)
		}
		a.socketGID = gid
	}
	if cfg.WorkloadAPISocketGroup != "" {
		gid, err := lookupGroup(cfg.WorkloadAPISocketGroup)
		if err != nil {
			return fmt.Errorf("agent: Workload API socket group: %w", err)
		}
		a.wlGID = gid
	}
	if a.wlSocket != "" && filepath.Clean(a.wlSocket) == filepath.Clean(a.socketPath) {
		return fmt.Errorf("agent: the Workload API socket %s is the SDS socket; give each its own path", a.wlSocket)
	}
	return nil
}

// useRotator builds the Rotator of rc, sharing the agent's clock, logger
// and registerer where rc sets none, so that a bad CA configuration
// fails in New rather than after the decision flow.
func (a *Agent) useRotator(rc RotatorConfig, reg prometheus.Registerer) error {
	if rc.Clock == nil {
		rc.Clock = a.clock
	}
	if rc.Logger == nil {
		rc.Logger = a.log
	}
	if rc.Registerer == nil {
		rc.Registerer = reg
	}
	r, err := NewRotator(rc)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	// New registered the metrics before the Rotator was built.
	r.taintReissues = a.metrics.taintReissues
	a.taints.follow(r.setTaints)
	a.rot = r
	a.caAddr = rc.CAAddr
	a.ownsCreds = rc.OutputCertsDir != "" && filepath.Clean(rc.OutputCertsDir) == filepath.Clean(a.credsDir)
	return nil
}

// ErrNotServing is Ready's answer until the SDS socket is open.
var ErrNotServing = errors.New("agent: not serving SDS yet: no certificate, or no trust, yet")

// Ready says whether the agent serves SDS: it holds a certificate (from
// the files or the CA) and has opened the socket. For a readiness probe.
func (a *Agent) Ready() error {
	if !a.serving.Load() {
		return ErrNotServing
	}
	return nil
}

// lookupGroup resolves a group name or numeric id.
func lookupGroup(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("group id %d is negative", n)
		}
		return n, nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", s, err)
	}
	n, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("group %q has a non-numeric id %q", s, g.Gid)
	}
	return n, nil
}

// Run takes the decision flow's first applicable step and serves until ctx
// is done, then stops the server, removes the socket and returns nil. It
// returns ErrAlreadyServing (wrapped) when an SDS server already answers
// on the socket, and an error when no step applies. Run may be called
// once.
func (a *Agent) Run(ctx context.Context) error {
	if a.running.Swap(true) {
		return errors.New("agent: Run called twice")
	}
	// Step 1: someone (an earlier agent, the Istio agent, SPIRE's) already
	// serves Envoy here.
	if err := a.CheckSocket(ctx); err != nil {
		return err
	}

	if a.node != nil {
		return a.runNode(ctx)
	}
	if a.ownsCreds {
		if err := a.checkOwned(); err != nil {
			return err
		}
		return a.runCA(ctx)
	}
	// Step 2: pre-provisioned files. Only some of them is a mistake an
	// operator must see, not a reason to ask a CA instead.
	present, missing := credentialFiles(a.credsDir)
	switch {
	case len(missing) == 0:
		if a.rot != nil {
			a.log.Info("credential files present; the CA configuration is not used", "credentials_dir", a.credsDir)
		}
		return a.runFiles(ctx)
	case len(present) > 0:
		return fmt.Errorf("agent: credentials directory %s holds %s but not %s: provide all three files or none",
			a.credsDir, strings.Join(present, ", "), strings.Join(missing, ", "))
	}

	// Step 3: a CA.
	if a.rot == nil {
		return fmt.Errorf("agent: no credential files in %s and no CA configured: set --ca-addr, --root-cert and --token-file, or provide %s, %s and %s",
			a.credsDir, CertChainFile, KeyFile, RootCertFile)
	}
	return a.runCA(ctx)
}

// checkOwned refuses to renew into a credentials directory whose
// certificate or key trustbridge did not write: before the agent kept its
// certificates in --credentials-dir, the files there were served and the
// CA left unused, so they may be another tool's (csi-driver-spiffe's).
func (a *Agent) checkOwned() error {
	if a.adopt {
		return nil
	}
	foreign, err := caclient.ForeignCredentials(a.credsDir)
	if err != nil {
		return fmt.Errorf("agent: credentials directory: %w", err)
	}
	if len(foreign) == 0 {
		return nil
	}
	return fmt.Errorf("agent: credentials directory %s holds %s that trustbridge did not write (no %s), and with a CA the agent would overwrite them: "+
		"to serve them, add --file-mounted-certs; to let the agent own the directory, empty it (or, if trustbridge wrote them, e.g. ca request, create %s)",
		a.credsDir, strings.Join(foreign, ", "), caclient.OwnerFile, filepath.Join(a.credsDir, caclient.OwnerFile))
}

// credentialFiles reports which of the three credential files exist (as
// anything: a directory in their place fails later, loudly).
func credentialFiles(dir string) (present, missing []string) {
	for _, name := range []string{CertChainFile, KeyFile, RootCertFile} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			present = append(present, name)
		} else {
			missing = append(missing, name)
		}
	}
	return present, missing
}

func (a *Agent) runFiles(ctx context.Context) error {
	w := newFileWatcher(a.credsDir, a.log, a.metrics)
	if err := w.init(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.log.Info("serving credential files", "credentials_dir", a.credsDir, logattr.SPIFFEID, w.id.String())
	wl := &workloadAPI{src: w.wl, noJWT: noJWTFiles}
	return a.serve(ctx, w.id, w.cell, w.trust, nil, wl, nil, func(ctx context.Context) error {
		return loop.Poll(ctx, a.clock, a.pollInterval, w.check)
	})
}

func (a *Agent) runCA(ctx context.Context) error {
	if err := a.rot.Init(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // shut down while waiting for the CA
		}
		return fmt.Errorf("agent: first certificate: %w", err)
	}
	id := a.rot.ID()
	trust := sds.NewTrustCell()
	// The first trust is what the server handed out with the first
	// certificate, per trust domain; --root-cert only ever verifies the
	// server.
	seed := trustMap(a.rot.Trust())
	if err := trust.Set(bundlesOf(seed)); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	// The server's decision for this workload (which trust domains, which
	// peers) is the local SDS server's policy, taken from the relayed ALL.
	// Until that arrives only the local trust domain is served: the seed
	// knows the trust domains the server allowed but not their peer
	// limits, and serving them unlimited would widen the decision.
	initial, err := relayedPolicy(id.TrustDomain(), id, "agent start", nil)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	policy := trustpolicy.NewCell(initial)
	r := &relay{
		addr:        a.caAddr,
		id:          id,
		policy:      policy,
		tlsConfig:   a.rot.ClientTLS,
		trust:       trust,
		serverRoots: a.rot.SetServerRoots,
		local:       id.TrustDomain(),
		nodeID:      id.String(),
		seed:        seed,
		clock:       a.clock,
		log:         a.log,
		metrics:     a.metrics,
		retry:       a.retry,
		relayed:     make(chan struct{}),
	}
	a.log.Info("serving certificates from the CA", "ca_addr", a.caAddr, logattr.SPIFFEID, id.String())
	// The Workload API opens with SDS, whose gate is the relay's alone:
	// until WatchBundles answers it serves the local roots, marked stale,
	// and an older server without it must not hold SDS back.
	wl, more := a.caStreams(id)
	if wl != nil {
		defer wl.close()
	}
	workers := append([]func(context.Context) error{a.rot.Run, r.Run}, more...)
	return a.serve(ctx, id, a.rot.Cell(), trust, trustpolicy.NewAccess(policy, nil), wl, r.relayed, workers...)
}

// caStreams is the Workload API of an agent with a CA and its workers;
// without a Workload API socket, none and the watcher of the server's
// tainted authorities, which the Workload API's bundle stream carries
// otherwise.
func (a *Agent) caStreams(id spiffeid.ID) (*workloadAPI, []func(context.Context) error) {
	if a.wlSocket == "" {
		return nil, []func(context.Context) error{a.taintWatcher(id).Run}
	}
	return a.caWorkloadAPI(id)
}

// Limits of the local gRPC server. Envoy's requests are small; a few
// streams per Envoy suffice.
const (
	maxRequestSize       = sds.MaxRequestSize
	maxConcurrentStreams = 100
)

// firstTrustWait bounds how long the agent waits for the server's first
// ALL before it opens the socket with the seed trust (--root-cert) alone.
const firstTrustWait = 10 * time.Second

// serve runs the workers and, once gate is closed (or after
// firstTrustWait; nil means at once), the SDS server for id on the
// socket, until ctx is done or a worker fails. Waiting for the gate keeps
// Envoy from starting with the local roots only and failing its first
// federated connections until the relayed trust arrives.
func (a *Agent) serve(ctx context.Context, id spiffeid.ID, creds sds.CredentialSource, trust sds.TrustSource, policy sds.AccessPolicy,
	wl *workloadAPI, gate <-chan struct{}, workers ...func(context.Context) error) error {
	gs, err := a.newSDSServer(id, creds, trust, policy)
	if err != nil {
		return err
	}
	return a.serveOn(ctx, gs, a.socketGID, wl, gate, workers...)
}

// serveOn is serve with the gRPC server built: gs is served on the
// socket, made with gid (a group, -1 for none, netutil.AnyUser for every
// local user).
func (a *Agent) serveOn(ctx context.Context, gs *grpc.Server, gid int, wl *workloadAPI, gate <-chan struct{}, workers ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		if err != nil {
			errOnce.Do(func() { firstErr = err })
		}
		cancel()
	}
	startWorkers(ctx, &wg, fail, workers)
	if gate != nil {
		a.waitForTrust(ctx, gate)
	}
	if ctx.Err() == nil {
		ln, err := listenSocket(ctx, a.socketPath, gid, a.probeTimeout)
		if err != nil {
			fail(fmt.Errorf("agent: %w", err))
		} else {
			defer ln.Close()
			a.serving.Store(true)
			defer a.serving.Store(false)
			a.log.Info("SDS listening", "socket", a.socketPath)
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := gs.Serve(ln)
				if ctx.Err() == nil {
					if err == nil {
						err = errors.New("gRPC server stopped")
					}
					fail(fmt.Errorf("agent: serving SDS: %w", err))
				}
			}()
			if wl != nil && a.wlSocket != "" {
				a.startWorkloadAPI(ctx, wl, &wg, fail)
			}
		}
	}
	<-ctx.Done()
	// SDS streams never end by themselves, so a graceful stop would wait
	// forever; Envoy reconnects to whoever serves the socket next.
	gs.Stop()
	wg.Wait()
	return firstErr
}

// newSDSServer is the gRPC server with the SDS service for id, within
// the local server's limits.
func (a *Agent) newSDSServer(id spiffeid.ID, creds sds.CredentialSource, trust sds.TrustSource, policy sds.AccessPolicy) (*grpc.Server, error) {
	// The socket's file mode is the access control (as in Istio): whoever
	// can connect is this workload.
	self := authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
		return authn.Identity{ID: id, Method: localMethod}, nil
	})
	srv, err := sds.New(sds.Config{
		TrustDomain:   id.TrustDomain(),
		RootCA:        a.rootCA,
		Trust:         trust,
		Credentials:   creds,
		Authenticator: self,
		Policy:        policy,
		Clock:         a.clock,
		Logger:        a.log,
		Registerer:    a.reg,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	gs := newLocalGRPCServer()
	srv.Register(gs)
	return gs, nil
}

// newLocalGRPCServer is a gRPC server for the agent's sockets, within the
// local server's limits, with opts besides.
func newLocalGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, opts...)...)
}

// startWorkers runs each worker in a goroutine on wg. A worker that
// returns before ctx is done, even without an error, fails the agent
// (fail): the workload's credentials or trust would stop being renewed
// while SDS went on serving them.
func startWorkers(ctx context.Context, wg *sync.WaitGroup, fail func(error), workers []func(context.Context) error) {
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := w(ctx)
			if ctx.Err() == nil {
				if err == nil {
					err = errors.New("stopped unexpectedly")
				}
				fail(fmt.Errorf("agent: %w", err))
			}
		}()
	}
}

// waitForTrust returns once gate is closed, after firstTrustWait, or
// when ctx is done, whichever comes first. The bound keeps a server
// without trust to relay from holding the workload's certificate back.
func (a *Agent) waitForTrust(ctx context.Context, gate <-chan struct{}) {
	t := a.clock.NewTimer(firstTrustWait)
	select {
	case <-gate:
	case <-t.C():
		a.log.Warn("no trust from the server's SDS yet; serving the --root-cert roots until it arrives", "waited", firstTrustWait)
	case <-ctx.Done():
	}
	t.Stop()
}

// localMethod names how callers on the socket are authenticated in the
// SDS server's logs: by being able to open the socket.
const localMethod = "unix-socket"

// trustMap is t per trust domain, the local one's roots being t.Local.
func trustMap(t caclient.Trust) map[spiffeid.TrustDomain][]*x509.Certificate {
	m := make(map[spiffeid.TrustDomain][]*x509.Certificate, len(t.Bundles)+1)
	for td, roots := range t.Bundles {
		m[td] = roots
	}
	m[t.TrustDomain] = t.Local
	return m
}

// bundlesOf turns a per-trust-domain map into bundles.
func bundlesOf(m map[spiffeid.TrustDomain][]*x509.Certificate) []*x509bundle.Bundle {
	out := make([]*x509bundle.Bundle, 0, len(m))
	for td, roots := range m {
		if len(roots) > 0 {
			out = append(out, x509bundle.FromX509Authorities(td, roots))
		}
	}
	return out
}
