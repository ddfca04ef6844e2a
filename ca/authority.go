package ca

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// Defaults for Config.
const (
	defaultRootTTL        = 8760 * time.Hour
	defaultRefreshHint    = 5 * time.Minute
	defaultWorkloadTTL    = 24 * time.Hour
	defaultMaxWorkloadTTL = 90 * 24 * time.Hour
	// retireMargin pads a retired root's removal for leaves signed in
	// another process (`ca issue`) whose clock reading came a moment later.
	retireMargin = time.Minute
	// recheckInterval bounds how long the scheduler sleeps, so changes
	// made by `trustbridge ca rotate` in another process are picked up.
	recheckInterval = 30 * time.Second
)

// DefaultConfig is what New fills the zero fields of a Config with, but
// for the trust domain, storage, clock, logger and registerer: the values
// a command line shows as its defaults. A zero WorkloadTTL (JWTSVIDTTL)
// is the default shortened to MaxWorkloadTTL (MaxJWTSVIDTTL) when that is
// lower.
func DefaultConfig() Config {
	return Config{
		KeyType: KeyECP256, RootTTL: defaultRootTTL, RefreshHint: defaultRefreshHint,
		WorkloadTTL: defaultWorkloadTTL, MaxWorkloadTTL: defaultMaxWorkloadTTL, UpstreamTTL: defaultUpstreamTTL,
		JWTKeyType: defaultJWTKeyType, JWTKeyTTL: defaultJWTKeyTTL, JWTSVIDTTL: defaultJWTSVIDTTL, MaxJWTSVIDTTL: defaultMaxJWTSVIDTTL,
	}
}

// Config configures a self-signed Authority. Zero fields take defaults.
type Config struct {
	TrustDomain    spiffeid.TrustDomain
	DataDir        string
	KeyType        KeyType
	RootTTL        time.Duration
	RefreshHint    time.Duration
	WorkloadTTL    time.Duration
	MaxWorkloadTTL time.Duration
	Clock          clock.Clock
	Logger         *slog.Logger
	Registerer     prometheus.Registerer
	// Plugin, when set, switches to plug-in mode (Istio cacerts): the
	// material comes from the watched directory, nothing rotates here, and
	// the published roots are those of root-cert.pem. KeyType and RootTTL
	// are unused.
	Plugin *PluginWatcher
	// Backend keeps the CA state; nil is the file store in DataDir.
	Backend castate.Backend
	// JWTKeyType is the algorithm of new JWT-SVID signing keys (default
	// ES256). JWT keys rotate like roots, in plug-in mode too: the
	// directory holds X.509 material only.
	JWTKeyType JWTKeyType
	// JWTKeyTTL is the lifetime of new JWT keys (default 720h); a
	// successor is published at half of it.
	JWTKeyTTL time.Duration
	// JWTSVIDTTL is the lifetime of a JWT-SVID asked for with TTL 0
	// (default 5m, or MaxJWTSVIDTTL if lower).
	JWTSVIDTTL time.Duration
	// MaxJWTSVIDTTL bounds every JWT-SVID (default 1h); a retired JWT key
	// stays published that long (the largest ever used).
	MaxJWTSVIDTTL time.Duration
	// Leader, when set, makes this Authority one of several replicas
	// sharing Backend: only while Leader.IsLeader() does it bootstrap,
	// prepare, activate, retire or remove roots, or write at all; otherwise
	// it follows, reloading the state the leader wrote, publishing it and
	// signing with its active root. nil means always the leader.
	Leader castate.Leader
	// Upstream, when set, makes this CA an intermediate: an upstream
	// signs its signing certificate (an intermediate, kept in the state
	// like a root), renewed at half its life; the bundle publishes the
	// upstream's roots. RootTTL is unused. Excludes Plugin.
	Upstream UpstreamAuthority
	// UpstreamTTL is the intermediate lifetime asked of the upstream
	// (default 48h); the upstream may grant less.
	UpstreamTTL time.Duration
	// SignsIntermediates makes roots created from now on leave room for
	// one level of intermediates (path length 1 instead of 0), so that
	// SignIntermediate can serve downstream trustbridges. Roots made
	// without it refuse to (rotate them once it is set).
	SignsIntermediates bool
	// WorkloadDNSZone is the zone of the workload DNS names this server
	// issues (workloaddns.Template.Zone of --workload-dns-name-template),
	// "" when it issues none. SignIntermediate lets a downstream's
	// intermediate vouch for DNS names in this zone only, and for none
	// when it is "" (see downstreamNameConstraints). In upstream mode an
	// intermediate whose name constraints refuse names in it is refused
	// (checkNameConstraints).
	WorkloadDNSZone string
	// DownstreamDNSDomains are further DNS domains (each and every name
	// below it) a downstream's intermediate may vouch for beside
	// WorkloadDNSZone: where downstream servers' own serving names live
	// (--downstream-dns-domain).
	DownstreamDNSDomains []string
	// ServingDNSNames are the DNS names of this server's serving
	// certificates (WithDNSNames, --grpc-dns-names). In upstream mode an
	// intermediate whose name constraints refuse one of them is refused:
	// the serving certificate it signed would verify nowhere.
	ServingDNSNames []string
	// Keys, when set, makes and keeps new root and JWT keys in a key
	// manager (an HSM); the state records only their references
	// (KeyRef). nil keeps keys in the state backend.
	Keys KeyManager
	// RequireHSM refuses a Config without Keys; audits of the snapshot
	// then flag own keys still in the state (RequireHSM()).
	RequireHSM bool
}

// defaultUpstreamTTL is the intermediate lifetime asked of an upstream.
const defaultUpstreamTTL = 48 * time.Hour

func (c *Config) applyDefaults() error {
	if err := c.checkRequired(); err != nil {
		return err
	}
	if err := c.checkDNSNames(); err != nil {
		return err
	}
	if c.KeyType == "" {
		c.KeyType = KeyECP256
	}
	if _, err := ParseKeyType(string(c.KeyType)); err != nil {
		return err
	}
	if err := c.applyTTLDefaults(); err != nil {
		return err
	}
	c.applyRuntimeDefaults()
	if err := c.timeline().validate(c.RootTTL); err != nil {
		return err
	}
	return c.applyJWTDefaults()
}

// checkRequired checks the fields without defaults and the modes that
// cannot be combined.
func (c *Config) checkRequired() error {
	if c.TrustDomain.IsZero() {
		return errors.New("trust domain is required")
	}
	if c.DataDir == "" && c.Backend == nil {
		return errors.New("data directory or state backend is required")
	}
	if c.Upstream != nil && c.Plugin != nil {
		return errors.New("an upstream authority and a plug-in CA directory (--ca-dir) cannot be combined: choose where the signing certificate comes from")
	}
	if c.UpstreamTTL < 0 {
		return errors.New("upstream TTL must not be negative")
	}
	if c.Plugin != nil && c.Keys != nil {
		return errors.New("a key manager does not apply in plug-in mode: the plug-in CA's key is in its directory")
	}
	if c.RequireHSM && c.Keys == nil {
		return errors.New("keys must live in a key manager (RequireHSM), and none is configured")
	}
	if c.Plugin != nil && c.Leader != nil {
		return errors.New("leader election is not supported in plug-in mode: every replica publishes its own --ca-dir")
	}
	return nil
}

// checkDNSNames checks and lowercases WorkloadDNSZone and
// ServingDNSNames, which name constraints are matched against.
func (c *Config) checkDNSNames() error {
	if c.WorkloadDNSZone != "" {
		zone, err := checkDNSName(c.WorkloadDNSZone)
		if err != nil {
			return fmt.Errorf("workload DNS zone %q (--workload-dns-name-template): %w", c.WorkloadDNSZone, err)
		}
		c.WorkloadDNSZone = zone
	}
	names, err := checkDNSNames(c.ServingDNSNames)
	if err != nil {
		return fmt.Errorf("serving DNS names (--grpc-dns-names): %w", err)
	}
	c.ServingDNSNames = names
	domains, err := checkDNSNames(c.DownstreamDNSDomains)
	if err != nil {
		return fmt.Errorf("downstream DNS domains (--downstream-dns-domain): %w", err)
	}
	c.DownstreamDNSDomains = domains
	return nil
}

func (c *Config) applyTTLDefaults() error {
	if c.RootTTL == 0 {
		c.RootTTL = defaultRootTTL
	}
	if c.RefreshHint == 0 {
		c.RefreshHint = defaultRefreshHint
	}
	if c.UpstreamTTL == 0 {
		c.UpstreamTTL = defaultUpstreamTTL
	}
	if c.RootTTL < 0 || c.WorkloadTTL < 0 || c.MaxWorkloadTTL < 0 {
		return errors.New("root TTL, workload TTL and maximum workload TTL must not be negative")
	}
	if c.MaxWorkloadTTL == 0 {
		c.MaxWorkloadTTL = defaultMaxWorkloadTTL
	}
	if c.WorkloadTTL == 0 {
		c.WorkloadTTL = min(defaultWorkloadTTL, c.MaxWorkloadTTL)
	}
	if c.WorkloadTTL > c.MaxWorkloadTTL {
		return fmt.Errorf("workload TTL %s exceeds the maximum %s", c.WorkloadTTL, c.MaxWorkloadTTL)
	}
	return nil
}

func (c *Config) applyRuntimeDefaults() {
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

func (c *Config) timeline() timeline {
	return timeline{RefreshHint: c.RefreshHint, MaxWorkloadTTL: c.MaxWorkloadTTL}
}

// Authority is the embedded, self-signed CA of one trust domain. It keeps
// its roots on disk, rotates them on the rotation timeline and signs workload
// certificates with the active root.
type Authority struct {
	cfg     Config
	store   *Store // the file store, when Config.Backend is nil
	backend castate.Backend
	metrics *metrics

	// stateMu serializes everything that reads or changes the shared
	// state (reloads, rotation checks, plug-in syncs); it is taken before
	// the backend's lock and before mu. Backend reads happen under stateMu
	// alone, so a slow or unreachable API server never stalls signing and
	// Bundle, which take mu; every writer of journal, roots and version
	// holds both.
	stateMu sync.Mutex
	mu      sync.RWMutex
	journal *castate.Journal
	roots   []*castate.Root   // in journal order
	jwtKeys []*castate.JWTKey // in journal order
	version string            // of the state as last written or read
	bundle  *spiffebundle.Bundle
	// localRoots is the X.509 bundle GetX509BundleForTrustDomain last
	// derived from bundle.
	localRoots atomic.Pointer[localBundle]

	subs []chan struct{} // Subscribe
	// published is the root states last published (id=state,...), so
	// subscribers hear of a state change that leaves the bundle alone.
	published string
	kick      chan struct{} // Recheck

	// served is when this process first published each root. The
	// publication lead of a prepared root counts from when peers could
	// fetch it; PublishedAt in the journal says when a trustbridge first
	// served it, and served says whether this process can vouch that it
	// has been served since.
	//
	// One process (file store): it served nothing while it was down, so
	// after a restart a waiting root's lead starts again at the restart;
	// served, set when the state is first loaded, is that instant, and
	// the leader moves PublishedAt up to it.
	//
	// Several replicas behind one Service (Config.Leader): a peer's poll
	// reaches any replica, and every replica serves the bundle of the
	// shared state, reloaded through a watch moments after the leader
	// writes. When leadership moves, the new leader moves PublishedAt up
	// to when it itself began serving the root: for a replica that was
	// following when the root was prepared that is the old PublishedAt
	// plus the watch delay (the lead is kept); for one that started later,
	// say after every replica was down, it is its own start, which covers
	// any gap when nobody served the root. The lead is never shortened,
	// at worst restarted.
	served map[string]time.Time
	// floored is set once this process wrote the state for the first
	// time, with a new sequence (sequence.go, rule 2).
	floored bool
	// lastErr is the error of the last scheduled rotation check, for Ready.
	lastErr error
	// plugin is the plug-in material as last published, so signing never
	// runs ahead of the bundle peers have seen.
	plugin *PluginMaterial
	// pluginSigners are earlier plug-in CA certificates, for IssuedHere.
	pluginSigners []pluginSigner
	// up is the upstream's health, in upstream mode (under mu).
	up upstreamStatus

	keyRefs keyRefCache // keys of Config.Keys, by KeyRef
}

// New loads the CA state from cfg.DataDir, creating the first root if the
// directory is fresh. A corrupt state directory is an error
// (ErrCorruptState), never overwritten.
func New(cfg Config) (*Authority, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	a := &Authority{
		cfg:     cfg,
		backend: cfg.Backend,
		kick:    make(chan struct{}, 1),
		served:  map[string]time.Time{},
		// Until state is loaded (a follower before the leader created
		// it) the bundle has no authorities: served by nobody, trusted
		// by nobody.
		bundle:  spiffebundle.New(cfg.TrustDomain),
		journal: &castate.Journal{TrustDomain: cfg.TrustDomain.Name()},
	}
	if a.backend == nil {
		a.store = NewStore(cfg.DataDir)
		a.backend = fileBackend{a.store}
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": cfg.TrustDomain.Name()}, cfg.Registerer)
	m, err := newMetrics(reg, a.readinessGauge)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	a.metrics = m
	if cfg.Plugin != nil {
		if err := cfg.Plugin.load(); err != nil {
			return nil, err
		}
		// syncPlugin publishes what Load loaded; the change Load
		// signalled, left pending, would have Run publish it again at
		// its first turn, after whatever happened meanwhile. A change
		// signalled from now on is a real one.
		select {
		case <-cfg.Plugin.changes():
		default:
		}
		if err := a.syncPlugin(); err != nil {
			return nil, err
		}
		return a, nil
	}
	if err := a.Reconcile(); err != nil {
		if !errors.Is(err, errNoIntermediate) {
			return nil, err
		}
		// An unreachable upstream at the first start: serve, not ready,
		// and let Run retry.
		a.recordCheck(err, "no intermediate from the upstream authority yet; the CA cannot sign until it answers")
	}
	return a, nil
}

// DefaultWorkloadTTL is the lifetime of a workload certificate whose
// request names none (Config.WorkloadTTL).
func (a *Authority) DefaultWorkloadTTL() time.Duration { return a.cfg.WorkloadTTL }

// MaxWorkloadTTL is the longest lifetime a workload certificate may ask
// for (Config.MaxWorkloadTTL).
func (a *Authority) MaxWorkloadTTL() time.Duration { return a.cfg.MaxWorkloadTTL }

// TrustDomain is the CA's trust domain.
func (a *Authority) TrustDomain() spiffeid.TrustDomain { return a.cfg.TrustDomain }
