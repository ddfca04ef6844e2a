package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
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
	// JWTIssuer, when set, is the iss claim of every JWT-SVID minted: an
	// OIDC issuer URL (jwtsvid.ParseIssuer) whose discovery document
	// publishes this trust domain's JWT authorities. "" mints without iss.
	JWTIssuer string
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

// Authority is the embedded CA of one trust domain: a façade over its two
// halves, split as SPIRE splits its server CA. The manager (manager.go)
// owns the state: it keeps the roots and JWT keys in the backend, rotates
// them on the rotation timeline (or follows a plug-in directory or an
// upstream), and publishes each state it settles on as a signing
// snapshot. The signer (signer.go) signs with the snapshot published
// last, taking no lock.
type Authority struct {
	cfg     *Config // shared by both halves, never changed after New
	metrics *metrics
	manager *manager
	signer  *signer
}

// New loads the CA state from cfg.DataDir, creating the first root if the
// directory is fresh. A corrupt state directory is an error
// (ErrCorruptState), never overwritten.
func New(cfg Config) (*Authority, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	a := &Authority{cfg: &cfg}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": cfg.TrustDomain.Name()}, cfg.Registerer)
	m, err := newMetrics(reg, a.readinessGauge)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	a.metrics = m
	a.manager = newManager(a.cfg, m)
	a.signer = &signer{cfg: a.cfg, metrics: m, board: a.manager.board, noMaterial: a.manager.noMaterial}
	if err := a.manager.start(); err != nil {
		return nil, err
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

// Recheck asks for a fresh look now rather than at the next scheduled
// check: Run checks the state (a reload, a rotation step that is due),
// then wakes every subscriber to look again though nothing may have
// changed. Call it when the shared state changed (a watch saw another
// process write) or when this replica became the leader, which looks
// again at what it records from now on (the audit trail writes only
// while leading). It never blocks; rechecks asked for while one is
// pending coalesce.
func (a *Authority) Recheck() { a.manager.recheck() }

// CheckError is the error of the last scheduled check (a rotation the
// key manager refused, an upstream that left no valid intermediate), or
// nil when it succeeded; the CA keeps signing with what it had.
func (a *Authority) CheckError() error { return a.manager.checkError() }

// Run reconciles on schedule (self-signed mode) or follows the plug-in
// directory (plug-in mode) until ctx is done.
func (a *Authority) Run(ctx context.Context) error { return a.manager.run(ctx) }

// ChangeAuthority applies an operator's change to one signing authority
// (see AuthorityChange) and returns the ID of the authority it applied
// to. prepare returns the prepared authority's: a new one, or the one
// already waiting, which it leaves as it is. Refusals wrap castate.ErrAuthorityState,
// castate.ErrAuthorityNotFound or castate.ErrNotLeader and say what to
// do instead; nothing changed then.
func (a *Authority) ChangeAuthority(c AuthorityChange) (string, error) {
	return a.manager.changeAuthority(c)
}

// Reconcile applies every rotation step due now and persists the result.
// On a follower (Config.Leader says it does not lead) it only reloads the
// state and publishes what it found.
func (a *Authority) Reconcile() error { return a.manager.reconcile() }

// Reload picks up state another replica or process wrote and publishes
// it, without changing anything. A watch on the shared state calls it (or
// Recheck) as soon as the leader writes.
func (a *Authority) Reload() error { return a.manager.reload() }

// Subscribe is the one way to be told of a change of the CA: it returns
// a channel of its own, signalled on every change of the published bundle
// or of a root's state (a prepared root activated leaves the bundle as it
// was), when the CA's health turns (a scheduled check starting or ceasing
// to fail, CheckError; an upstream outage starting or ending, Upstream),
// and on Recheck. The channel is already signalled when the CA has state
// to publish, so a subscriber added after New hears of the first bundle
// too.
//
// Signals coalesce: one value stands for any number of changes, and the
// subscriber reads the current state (Bundle, Roots, Ready) when it
// wakes. The CA never blocks on a subscriber that has not drained its
// channel.
func (a *Authority) Subscribe() <-chan struct{} { return a.manager.subscribe() }

// Bundle returns the published bundle: every prepared, active and retired
// root and JWT key (a JWT authority under its kid), the sequence number
// and the refresh hint. It is shared and must
// not be modified; Clone it first.
func (a *Authority) Bundle() *spiffebundle.Bundle { return a.signer.bundle() }

// Roots lists the roots and their state.
func (a *Authority) Roots() []RootInfo { return a.manager.rootInfos() }

// Sequence is the published bundle's sequence number.
func (a *Authority) Sequence() uint64 { return a.manager.sequence() }

// Ready reports why the CA cannot sign, or nil. In plug-in mode a bad
// change to the directory makes it not ready, though it keeps signing
// with the last good material: operators must see the error.
func (a *Authority) Ready() error { return a.manager.ready() }

// readinessGauge is 1 while Ready reports a problem, so alerts need not
// scrape /readyz.
func (a *Authority) readinessGauge() float64 {
	if a.Ready() != nil {
		return 1
	}
	return 0
}

// Warning reports what does not stop the CA from signing but operators
// must see, or nil: in upstream mode, an upstream that has been failing
// while the current intermediate still signs (once none is left, Ready
// fails instead).
func (a *Authority) Warning() error { return a.manager.warning() }

// Upstream reports the upstream's health; ok is false outside upstream
// mode.
func (a *Authority) Upstream() (st UpstreamStatus, ok bool) { return a.manager.upstreamHealth() }

// Plugin is the plug-in CA directory's watcher, nil without one: cmd
// re-reads it on SIGHUP (PluginWatcher.Check) instead of waiting for its
// next poll.
func (a *Authority) Plugin() *PluginWatcher { return a.cfg.Plugin }

// SignJWT mints a JWT-SVID for id, an identity the caller has proved, for
// audience, with the active JWT key. ttl 0 is Config.JWTSVIDTTL; a ttl
// over Config.MaxJWTSVIDTTL (or the journal's recorded maximum, when the
// leader's is lower) is clamped to it, and the token never
// outlives the key's NotAfter (the key leaves the bundle then); a
// negative ttl, or one under a second (the resolution of JWT times), is
// ErrInvalidTTL. An empty audience is refused (wrapping
// jwtsvid.ErrInvalidClaims): a token for no audience is accepted by
// anyone who validates it without naming one.
func (a *Authority) SignJWT(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
	return a.signer.signJWTSVID(id, audience, ttl)
}

// JWTKeys lists the JWT signing keys and their state, in journal order.
func (a *Authority) JWTKeys() []JWTKeyInfo { return a.manager.jwtKeyInfos() }

// KeyStorage names where the CA's new keys live: "state" for the state
// backend, else the key manager's String() (or "key manager").
func (a *Authority) KeyStorage() string { return a.manager.keyStorage() }

// RequireHSM is Config.RequireHSM: new keys must be, and old ones are
// audited to be, in a key manager.
func (a *Authority) RequireHSM() bool { return a.cfg.RequireHSM }

// SignX509SVID signs an X509-SVID for p.PublicKey and p.SPIFFEID, the
// identity the caller proved, with the active root or intermediate: the
// one entry point of every workload leaf (SDS, the certificate service,
// whose edge parses and judges the CSR it receives). The key's strength,
// the identity, the TTL against Config.MaxWorkloadTTL, the DNS names and
// the extensions are checked as the package-level SignX509SVID does.
func (a *Authority) SignX509SVID(p X509SVIDParams) (*Issued, error) { return a.signer.signSVID(p) }

// SignIntermediate signs a downstream trustbridge's CSR as an
// intermediate CA of this trust domain: the server side of a nested
// upstream (the caller, the certificate service, decides who may ask).
// The CSR must come from ParseCSR and may name no identity but
// spiffe://<trust domain>. The certificate can sign leaves only (path
// length 0), carries the trust domain's SPIFFE ID and critical name
// constraints (downstreamNameConstraints): URIs of the trust domain only
// (X509-SVID §4), DNS names of Config.WorkloadDNSZone and
// Config.DownstreamDNSDomains only (none without either), no IP address. It lives ttl (0: the
// default upstream TTL), clamped to the maximum workload TTL, which is
// how long a retired root of ours stays published, and to our own
// signing chain. The answer's Chain is the new certificate, our signing
// certificate when it is not a root, and the certificates above it; Roots
// are our published roots.
func (a *Authority) SignIntermediate(csr *x509.CertificateRequest, ttl time.Duration) (*UpstreamChain, error) {
	return a.signer.signIntermediate(csr, ttl)
}

// IssuedHere reports whether issuer is one of this CA's own signing
// certificates, one that may have signed a leaf still valid: the active
// root or upstream intermediate, the retired ones kept until every leaf
// they signed has expired, and a prepared one (in upstream mode the
// intermediates themselves, never the upstream's certificates). A
// prepared root has signed nothing here, but its key is ours, and with
// shared (kube) storage a leader whose state is ahead of ours may already
// sign with it: refusing it would refuse that leader's fresh leaves. In
// plug-in mode it is the directory's current CA certificate, and those
// this process signed with before the directory changed, until their
// leaves have expired (a restart forgets them); never a root of
// root-cert.pem, whose key is not ours.
//
// The certificate service asks it of the issuer of every X509-SVID a
// caller presents (authn.WithOwnIssuers): only a leaf this CA signed
// carries a grant record this CA wrote. Other certificates that verify
// against the same roots, a downstream intermediate's or the upstream's
// own, may carry any record. Issuers are compared byte for byte.
func (a *Authority) IssuedHere(issuer *x509.Certificate) bool { return a.signer.issuedHere(issuer) }

// GetX509BundleForTrustDomain makes the Authority an x509bundle.Source of
// its published roots, as they are at each call, for its own trust domain
// only: what a verifier of the CA's own workloads (the certificate
// service's mTLS authenticator) trusts. Any trust domain but the CA's is
// an error: federated trust domains never authenticate to the CA.
//
// It hands out the same *x509bundle.Bundle until the CA publishes a new
// bundle, so a cache keyed by the bundle pointer (authn's verified client
// chains) stays valid exactly as long as the roots do.
func (a *Authority) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return a.signer.x509Bundle(td)
}
