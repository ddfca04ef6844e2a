package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/schedule"
)

// Defaults for Config.
const (
	DefaultRootTTL        = 8760 * time.Hour
	DefaultRefreshHint    = 5 * time.Minute
	DefaultWorkloadTTL    = 24 * time.Hour
	DefaultMaxWorkloadTTL = 90 * 24 * time.Hour
	// retireMargin pads a retired root's removal for leaves signed in
	// another process (`ca issue`) whose clock reading came a moment later.
	retireMargin = time.Minute
	// recheckInterval bounds how long the scheduler sleeps, so changes
	// made by `trustbridge ca rotate` in another process are picked up.
	recheckInterval = 30 * time.Second
)

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
	Backend Backend
	// Leader, when set, makes this Authority one of several replicas
	// sharing Backend: only while Leader.IsLeader() does it bootstrap,
	// prepare, activate, retire or remove roots, or write at all; otherwise
	// it follows, reloading the state the leader wrote, publishing it and
	// signing with its active root. nil means always the leader.
	Leader Leader
}

func (c *Config) applyDefaults() error {
	if c.TrustDomain.IsZero() {
		return errors.New("trust domain is required")
	}
	if c.DataDir == "" && c.Backend == nil {
		return errors.New("data directory or state backend is required")
	}
	if c.Plugin != nil && c.Leader != nil {
		return errors.New("leader election is not supported in plug-in mode: every replica publishes its own --ca-dir")
	}
	if c.KeyType == "" {
		c.KeyType = KeyECP256
	}
	if _, err := ParseKeyType(string(c.KeyType)); err != nil {
		return err
	}
	if c.RootTTL == 0 {
		c.RootTTL = DefaultRootTTL
	}
	if c.RefreshHint == 0 {
		c.RefreshHint = DefaultRefreshHint
	}
	if c.RootTTL < 0 || c.WorkloadTTL < 0 || c.MaxWorkloadTTL < 0 {
		return errors.New("root TTL, workload TTL and maximum workload TTL must not be negative")
	}
	if c.MaxWorkloadTTL == 0 {
		c.MaxWorkloadTTL = DefaultMaxWorkloadTTL
	}
	if c.WorkloadTTL == 0 {
		c.WorkloadTTL = min(DefaultWorkloadTTL, c.MaxWorkloadTTL)
	}
	if c.WorkloadTTL > c.MaxWorkloadTTL {
		return fmt.Errorf("workload TTL %s exceeds the maximum %s", c.WorkloadTTL, c.MaxWorkloadTTL)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return c.timeline().Validate(c.RootTTL)
}

func (c *Config) timeline() Timeline {
	return Timeline{RefreshHint: c.RefreshHint, MaxWorkloadTTL: c.MaxWorkloadTTL}
}

// timelineLocked is the configured timeline, with the maximum workload TTL
// raised to the largest ever recorded in the journal: leaves signed under
// an earlier, longer maximum may still be out there.
func (a *Authority) timelineLocked() Timeline {
	tl := a.cfg.timeline()
	if rec := time.Duration(a.journal.MaxWorkloadTTLSeconds) * time.Second; rec > tl.MaxWorkloadTTL {
		tl.MaxWorkloadTTL = rec
	}
	return tl
}

// Authority is the embedded, self-signed CA of one trust domain. It keeps
// its roots on disk, rotates them on the Timeline and signs workload
// certificates with the active root.
type Authority struct {
	cfg     Config
	store   *Store // the file store, when Config.Backend is nil
	backend Backend
	metrics *metrics

	// stateMu serializes everything that reads or changes the shared
	// state (reloads, rotation checks, plug-in syncs); it is taken before
	// the backend's lock and before mu. Backend reads happen under stateMu
	// alone, so a slow or unreachable API server never stalls Sign and
	// Bundle, which take mu; every writer of journal, roots and version
	// holds both.
	stateMu sync.Mutex
	mu      sync.RWMutex
	journal *Journal
	roots   []*Root // in journal order
	version string  // of the state as last written or read
	bundle  *spiffebundle.Bundle

	changes chan struct{}
	subs    []chan struct{} // Subscribe
	// published is the root states last published (id=state,...), so
	// subscribers hear of a state change that leaves the bundle alone.
	published string
	kick      chan struct{} // Kick

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
	// lastErr is the error of the last scheduled rotation check, for Ready.
	lastErr error
	// plugin is the plug-in material as last published, so signing never
	// runs ahead of the bundle peers have seen.
	plugin *PluginMaterial
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
		changes: make(chan struct{}, 1),
		kick:    make(chan struct{}, 1),
		served:  map[string]time.Time{},
		// Until state is loaded (a follower before the leader created
		// it) the bundle has no authorities: served by nobody, trusted
		// by nobody.
		bundle:  spiffebundle.New(cfg.TrustDomain),
		journal: &Journal{TrustDomain: cfg.TrustDomain.Name()},
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
		if err := cfg.Plugin.Load(); err != nil {
			return nil, err
		}
		if err := a.syncPlugin(); err != nil {
			return nil, err
		}
		return a, nil
	}
	if err := a.Reconcile(); err != nil {
		return nil, err
	}
	return a, nil
}

// syncPlugin publishes the plug-in directory's roots, bumping the
// sequence when the set changed, and persists it.
func (a *Authority) syncPlugin() error {
	unlock, err := a.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	j, roots, version, err := a.backend.Load(a.cfg.TrustDomain.Name())
	if err != nil {
		return err
	}
	if len(roots) > 0 {
		return fmt.Errorf("ca: %s holds self-signed roots; switching to --ca-dir would drop them from the bundle while certificates they signed are still in use; use a fresh --data-dir", a.backend.Describe())
	}
	if j == nil {
		j = &Journal{TrustDomain: a.cfg.TrustDomain.Name()}
	}
	a.journal = j
	now := a.cfg.Clock.Now()
	m := a.cfg.Plugin.Current()
	recs, changed := a.pluginRecords(now, m, j.PluginRoots)
	if changed || j.Sequence == 0 {
		j.PluginRoots = recs
		j.Sequence++
		j.Updated = now
		ids := make([]string, 0, len(recs))
		for _, r := range recs {
			ids = append(ids, r.SHA256)
		}
		j.Events = append(j.Events, JournalNote{At: now, Event: "plug-in roots changed", RootID: strings.Join(ids, ",")})
		a.metrics.rotations.WithLabelValues("plugin_change").Inc()
		a.cfg.Logger.Info("plug-in CA roots published", logattr.Roots, len(recs), logattr.Sequence, j.Sequence)
		if version, err = a.backend.Commit(version, j, nil); err != nil {
			return err
		}
	}
	a.version = version
	a.plugin = m
	a.roots = a.roots[:0]
	for _, rec := range j.PluginRoots {
		cert, err := x509.ParseCertificate(rec.DER)
		if err != nil {
			return fmt.Errorf("ca: journal plug-in root %s: %w", rec.SHA256, err)
		}
		state := StateExternal
		if !rec.RemoveAfter.IsZero() {
			state = StateRetired
		}
		a.roots = append(a.roots, &Root{RootRecord: RootRecord{
			ID: cert.SerialNumber.Text(16), State: state, CertSHA256: rec.SHA256, RemoveAfter: rec.RemoveAfter,
		}, Cert: cert})
	}
	a.publishLocked()
	return nil
}

// pluginRecords computes the plug-in roots to publish: those of the
// directory, plus earlier ones that left it, kept (as retired) until every
// leaf they could have signed has expired. changed reports whether the
// published set differs from prev.
func (a *Authority) pluginRecords(now time.Time, m *PluginMaterial, prev []PluginRootRecord) ([]PluginRootRecord, bool) {
	current := map[string]bool{}
	var recs []PluginRootRecord
	for _, r := range m.Roots {
		fp := fingerprint(r)
		current[fp] = true
		recs = append(recs, PluginRootRecord{SHA256: fp, DER: r.Raw})
	}
	removeAfter := now.Add(retireMargin + a.timelineLocked().MaxWorkloadTTL)
	for _, p := range prev {
		if current[p.SHA256] {
			continue
		}
		if p.RemoveAfter.IsZero() {
			p.RemoveAfter = removeAfter
		}
		if now.Before(p.RemoveAfter) {
			recs = append(recs, p)
		}
	}
	key := func(rs []PluginRootRecord) string {
		ids := make([]string, len(rs))
		for i, r := range rs {
			ids[i] = r.SHA256
		}
		sort.Strings(ids)
		return strings.Join(ids, ",")
	}
	return recs, key(recs) != key(prev)
}

// nextPluginRemoval is when the next retired plug-in root leaves the
// bundle, or zero.
func (a *Authority) nextPluginRemoval() time.Time {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var next time.Time
	for _, r := range a.roots {
		if r.State == StateRetired && (next.IsZero() || r.RemoveAfter.Before(next)) {
			next = r.RemoveAfter
		}
	}
	return next
}

// TrustDomain is the CA's trust domain.
func (a *Authority) TrustDomain() spiffeid.TrustDomain { return a.cfg.TrustDomain }

// Changes is signalled (coalesced) whenever the published bundle changes.
// It has one reader; other consumers use Subscribe.
func (a *Authority) Changes() <-chan struct{} { return a.changes }

// Subscribe returns a channel of its own, signalled (coalesced) on every
// later change of the published bundle or of a root's state (a prepared
// root activated leaves the bundle as it was).
func (a *Authority) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	a.mu.Lock()
	a.subs = append(a.subs, ch)
	a.mu.Unlock()
	return ch
}

// Bundle returns the published bundle: every prepared, active and retired
// root, the sequence number and the refresh hint. It is shared and must
// not be modified; Clone it first.
func (a *Authority) Bundle() *spiffebundle.Bundle {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.bundle
}

// RootInfo describes a root for status reports.
type RootInfo struct {
	RootRecord
	Cert *x509.Certificate
}

// Roots lists the roots and their state.
func (a *Authority) Roots() []RootInfo {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]RootInfo, 0, len(a.roots))
	for _, r := range a.roots {
		out = append(out, RootInfo{RootRecord: r.RootRecord, Cert: r.Cert})
	}
	return out
}

// Sequence is the published bundle's sequence number.
func (a *Authority) Sequence() uint64 {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.journal.Sequence
}

// Sign signs a workload CSR for id, an identity the caller has proved. The
// CSR must come from ParseCSR, which checks its signature. extra are
// private extensions for the leaf, as for the package-level Sign.
func (a *Authority) Sign(csr *x509.CertificateRequest, id spiffeid.ID, ttl time.Duration, extra ...pkix.Extension) (*Issued, error) {
	start := time.Now()
	defer func() { a.metrics.signingTime.Observe(time.Since(start).Seconds()) }()
	// Signing under the read lock, with the time taken under it, orders
	// every signing before or after a retirement: a leaf never outlives
	// the RemoveAfter computed for its root.
	a.mu.RLock()
	defer a.mu.RUnlock()
	m, err := a.signingMaterialLocked()
	if err != nil {
		a.metrics.signings.WithLabelValues("signing_material").Inc()
		return nil, err
	}
	issued, err := Sign(a.cfg.Clock.Now(), m, a.policy(), csr, id, ttl, extra...)
	if err != nil {
		a.metrics.signings.WithLabelValues(signResult(err)).Inc()
		return nil, err
	}
	a.metrics.signings.WithLabelValues("ok").Inc()
	return issued, nil
}

func signResult(err error) string {
	if kind := SignErrorKind(err); kind != "" {
		return kind
	}
	return "error"
}

// SignErrorKind returns the stable label of a Sign error, for metric
// labels and logs: "invalid_csr", "identity_not_allowed", "invalid_ttl",
// "signing_material", or "" for any other error (a server fault, which
// each caller names itself).
func SignErrorKind(err error) string {
	switch {
	case errors.Is(err, ErrInvalidCSR):
		return "invalid_csr"
	case errors.Is(err, ErrIdentityNotAllowed):
		return "identity_not_allowed"
	case errors.Is(err, ErrInvalidTTL):
		return "invalid_ttl"
	case errors.Is(err, ErrInvalidSigningMaterial):
		return "signing_material"
	default:
		return ""
	}
}

func (a *Authority) policy() Policy {
	return Policy{TrustDomain: a.cfg.TrustDomain, DefaultTTL: a.cfg.WorkloadTTL, MaxTTL: a.cfg.MaxWorkloadTTL}
}

func (a *Authority) signingMaterialLocked() (SigningMaterial, error) {
	if a.cfg.Plugin != nil {
		p := a.plugin
		if p == nil {
			return SigningMaterial{}, errors.New("ca: no plug-in CA material published")
		}
		return SigningMaterial{Cert: p.Cert, Key: p.Key, Intermediates: p.Intermediates, Roots: p.Roots}, nil
	}
	var m SigningMaterial
	for _, r := range a.roots {
		m.Roots = append(m.Roots, r.Cert)
		if r.State == StateActive {
			m.Cert, m.Key = r.Cert, r.Key
		}
	}
	if m.Cert == nil {
		if len(a.roots) == 0 && !a.leading() {
			return m, fmt.Errorf("ca: %w: no CA state in %s yet; the leader creates it", ErrInvalidSigningMaterial, a.backend.Describe())
		}
		return m, fmt.Errorf("ca: %w: no active root", ErrInvalidSigningMaterial)
	}
	return m, nil
}

// Rotate publishes a successor root now, unless one is already waiting.
// The successor signs only after the usual publication lead.
func (a *Authority) Rotate() error {
	if a.cfg.Plugin != nil {
		return errors.New("ca: roots are managed outside trustbridge (--ca-dir); rotate them there")
	}
	if !a.leading() {
		return fmt.Errorf("ca: %w: only the leader rotates roots", ErrNotLeader)
	}
	return a.withStateLocked(func() error {
		for _, r := range a.roots {
			if r.State == StatePrepared {
				a.cfg.Logger.Info("rotation requested but a prepared root is already waiting", logattr.RootID, r.ID)
				return nil
			}
		}
		if err := a.prepareLocked(a.cfg.Clock.Now(), "forced"); err != nil {
			return err
		}
		return a.commitLocked()
	})
}

// conflictAttempts bounds how often one change is decided again after
// another writer got in first.
const conflictAttempts = 2

// withStateLocked runs f holding the state's exclusive lock and a.mu,
// after picking up changes other processes made to it. When another writer
// committed between the load and f's commit (ErrConflict), f's version is
// dropped, never published, and f decides again on the reloaded state.
func (a *Authority) withStateLocked(f func() error) error {
	unlock, err := a.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	for attempt := 0; ; attempt++ {
		if err := a.reloadStateLocked(attempt > 0); err != nil {
			return err
		}
		err := a.decideLocked(f)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrConflict) {
			return err
		}
		a.cfg.Logger.Warn("CA state changed by another writer; reloading it and deciding again", logattr.Error, err)
		if attempt+1 == conflictAttempts {
			// Serve what the other writer committed, not this version.
			if rerr := a.reloadStateLocked(true); rerr != nil {
				return errors.Join(err, rerr)
			}
			return err
		}
	}
}

// decideLocked runs f under mu. f changes state in place before saving
// it; if the save fails, what is in memory goes back to what is stored and
// published, or the CA would sign with a root nobody has seen.
func (a *Authority) decideLocked(f func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	journal, roots := a.journal.clone(), cloneRoots(a.roots)
	err := f()
	if err != nil {
		a.journal, a.roots = journal, roots
	}
	return err
}

// reloadStateLocked reads the state (the caller holds lockState, not mu)
// and, under mu, publishes it.
func (a *Authority) reloadStateLocked(force bool) error {
	st, err := a.readState(force)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applyStateLocked(st)
}

// Reload picks up state another replica or process wrote and publishes
// it, without changing anything. A watch on the shared state calls it (or
// Kick) as soon as the leader writes.
func (a *Authority) Reload() error {
	if a.cfg.Plugin != nil {
		return nil
	}
	unlock, err := a.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	return a.reloadStateLocked(false)
}

// Kick makes Run check the state now instead of at its next scheduled
// check: call it when the shared state changed (a watch) or when this
// replica became the leader. It never blocks.
func (a *Authority) Kick() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// leading reports whether this Authority may change the state.
func (a *Authority) leading() bool {
	return a.cfg.Leader == nil || a.cfg.Leader.IsLeader()
}

// lockState takes stateMu, then the state's exclusive lock; the returned
// func releases both. Callers take a.mu only around changes readers see.
func (a *Authority) lockState() (func(), error) {
	a.stateMu.Lock()
	unlock, err := a.backend.Lock(true)
	if err != nil {
		a.stateMu.Unlock()
		return nil, err
	}
	return func() {
		unlock()
		a.stateMu.Unlock()
	}, nil
}

// recordCheck keeps the outcome of a scheduled check for Ready and
// reports a failure (metric, log); what says what was kept.
func (a *Authority) recordCheck(err error, msg string) {
	a.mu.Lock()
	a.lastErr = err
	a.mu.Unlock()
	if err != nil {
		a.metrics.reconcileErrors.Inc()
		a.cfg.Logger.Error(msg, logattr.Error, err)
	}
}

func cloneRoots(roots []*Root) []*Root {
	out := make([]*Root, len(roots))
	for i, r := range roots {
		c := *r
		out[i] = &c
	}
	return out
}

// Reconcile applies every rotation step due now and persists the result.
// On a follower (Config.Leader says it does not lead) it only reloads the
// state and publishes what it found.
func (a *Authority) Reconcile() error {
	if !a.leading() {
		return a.Reload()
	}
	return a.withStateLocked(a.reconcileLocked)
}

func (a *Authority) reconcileLocked() error {
	changed := false
	for _, r := range a.roots {
		// A root prepared by `ca rotate` has no PublishedAt; one that
		// waited while no server ran, or that this process began serving
		// only later, starts its lead when this process began serving it
		// (see served).
		if r.State != StatePrepared {
			continue
		}
		if s, ok := a.served[r.ID]; ok && s.After(r.PublishedAt) {
			r.PublishedAt = s
			changed = true
		}
	}
	if st := a.journal.Settings; st != nil && st.RefreshHintSeconds != int64(a.cfg.RefreshHint/time.Second) && len(a.roots) > 0 {
		// The hint is part of the published document.
		a.journal.Sequence++
		changed = true
	}
	for range 10 { // a handful of steps at most; the bound guards against a plan bug
		now := a.cfg.Clock.Now()
		step, index, _ := a.timelineLocked().Plan(now, a.timesLocked())
		if step == StepNone {
			break
		}
		if err := a.applyLocked(now, step, index); err != nil {
			return err
		}
		changed = true
	}
	if changed || a.journal.Settings == nil || *a.journal.Settings != a.settings() {
		return a.commitLocked()
	}
	return nil
}

func (a *Authority) settings() JournalSettings {
	return JournalSettings{
		KeyType:                   a.cfg.KeyType,
		RootTTLSeconds:            int64(a.cfg.RootTTL / time.Second),
		RefreshHintSeconds:        int64(a.cfg.RefreshHint / time.Second),
		CurrentMaxWorkloadSeconds: int64(a.cfg.MaxWorkloadTTL / time.Second),
	}
}

// NextCheck is when Reconcile next has work to do, or sooner so that
// changes from other processes are picked up.
func (a *Authority) NextCheck(now time.Time) time.Time {
	a.mu.RLock()
	_, _, next := a.timelineLocked().Plan(now, a.timesLocked())
	a.mu.RUnlock()
	limit := now.Add(recheckInterval)
	if next.IsZero() || next.After(limit) {
		return limit
	}
	return next
}

// Run reconciles on schedule (self-signed mode) or follows the plug-in
// directory (plug-in mode) until ctx is done.
func (a *Authority) Run(ctx context.Context) error {
	if a.cfg.Plugin != nil {
		return a.runPlugin(ctx)
	}
	c := cron.New(cron.WithLocation(time.UTC))
	// cron asks the schedule for the next time right after starting a job,
	// before the job has run; a step the job itself makes due (activation
	// after publication) would wait for the next recheck. So each run
	// re-arms the entry with the time the plan gives after it.
	var (
		armMu sync.Mutex
		entry cron.EntryID
		arm   func()
	)
	job := cron.FuncJob(func() {
		a.recordCheck(a.Reconcile(), "CA rotation check failed; keeping the current roots")
		arm()
	})
	arm = func() {
		armMu.Lock()
		defer armMu.Unlock()
		if entry != 0 {
			c.Remove(entry)
		}
		entry = c.Schedule(schedule.Once(a.NextCheck(a.cfg.Clock.Now())), job)
	}
	arm()
	c.Start()
	for {
		select {
		case <-ctx.Done():
			<-c.Stop().Done()
			return nil
		case <-a.kick:
			job()
		}
	}
}

func (a *Authority) runPlugin(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- a.cfg.Plugin.Run(ctx) }()
	for {
		// Wake up for a directory change, or when a retired plug-in root
		// is due to leave the bundle.
		var (
			removal <-chan time.Time
			timer   clock.Timer
		)
		if next := a.nextPluginRemoval(); !next.IsZero() {
			timer = a.cfg.Clock.NewTimer(next.Sub(a.cfg.Clock.Now()))
			removal = timer.C()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return <-done
		case <-removal:
		case <-a.cfg.Plugin.Changes():
		}
		if timer != nil {
			timer.Stop()
		}
		a.recordCheck(a.syncPlugin(), "could not publish new plug-in CA roots; keeping the previous bundle and material")
	}
}

func (a *Authority) timesLocked() []RootTimes {
	out := make([]RootTimes, len(a.roots))
	for i, r := range a.roots {
		out[i] = RootTimes{
			State: r.State, NotBefore: r.Cert.NotBefore, NotAfter: r.Cert.NotAfter,
			PreparedAt: r.PreparedAt, MinActivateAt: r.MinActivateAt, PublishedAt: r.PublishedAt, RemoveAfter: r.RemoveAfter,
		}
	}
	return out
}

// loadedState is the state as read from the backend.
type loadedState struct {
	journal *Journal
	roots   []*Root
	version string
}

// readState loads the state if its version changed since it was last read
// or written (always, with force); nil means unchanged. The caller holds
// lockState but not mu: the backend may be an API server that does not
// answer, and a.version only changes under lockState.
func (a *Authority) readState(force bool) (*loadedState, error) {
	if !force && a.version != "" {
		if v, err := a.backend.Version(); err == nil && v == a.version {
			return nil, nil
		}
	}
	j, roots, version, err := a.backend.Load(a.cfg.TrustDomain.Name())
	if err != nil {
		return nil, err
	}
	return &loadedState{journal: j, roots: roots, version: version}, nil
}

// applyStateLocked checks state read by readState against what is
// published and publishes it; nil st (unchanged) does nothing.
func (a *Authority) applyStateLocked(st *loadedState) error {
	if st == nil {
		return nil
	}
	j, roots, version := st.journal, st.roots, st.version
	if a.journal.Sequence > 0 {
		// Once running, state never starts over: a vanished journal or a
		// sequence going back means someone removed or replaced the
		// state under us, and a new root would drop the ones peers use.
		if j == nil {
			return fmt.Errorf("ca: %s disappeared while the server was running; refusing to start a new CA over it (restore it, or restart on purpose)", a.backend.Describe())
		}
		if j.Sequence < a.journal.Sequence {
			return fmt.Errorf("ca: %s went back from sequence %d to %d; refusing to publish an older state", a.backend.Describe(), a.journal.Sequence, j.Sequence)
		}
	}
	if j == nil {
		j = &Journal{TrustDomain: a.cfg.TrustDomain.Name()}
	} else if len(j.PluginRoots) > 0 {
		return fmt.Errorf("ca: %s was used with a plug-in CA (--ca-dir); starting a self-signed CA on it would drop those roots from the bundle at once; keep --ca-dir or use a fresh --data-dir", a.backend.Describe())
	} else if a.version != "" && version != a.version {
		a.cfg.Logger.Info("CA state changed in "+a.backend.Describe()+"; reloaded", logattr.Sequence, j.Sequence)
	}
	a.journal, a.roots, a.version = j, roots, version
	a.publishLocked()
	return nil
}

func (a *Authority) applyLocked(now time.Time, step Step, index int) error {
	switch step {
	case StepBootstrap:
		return a.newRootLocked(now, StateActive, "bootstrap")
	case StepPrepare:
		return a.prepareLocked(now, "scheduled")
	case StepActivate:
		for _, r := range a.roots {
			if r.State == StateActive {
				r.State = StateRetired
				r.RetiredAt = now
				r.RemoveAfter = a.timelineLocked().RemoveAfter(RootTimes{NotAfter: r.Cert.NotAfter}, now.Add(retireMargin))
				a.event(now, "retired", r.ID)
			}
		}
		p := a.roots[index]
		p.State = StateActive
		p.ActivatedAt = now
		a.event(now, "activated", p.ID)
		return nil
	case StepRemove:
		r := a.roots[index]
		a.roots = append(a.roots[:index:index], a.roots[index+1:]...)
		a.journal.Sequence++
		a.event(now, "removed", r.ID)
		return nil
	}
	return fmt.Errorf("ca: unknown rotation step %v", step)
}

func (a *Authority) prepareLocked(now time.Time, why string) error {
	if err := a.newRootLocked(now, StatePrepared, why); err != nil {
		return err
	}
	return nil
}

func (a *Authority) newRootLocked(now time.Time, state RootState, why string) error {
	cert, key, err := newRootCert(a.cfg.TrustDomain, a.cfg.KeyType, now, a.cfg.RootTTL)
	if err != nil {
		return fmt.Errorf("ca: create root: %w", err)
	}
	id := cert.SerialNumber.Text(16)
	r := &Root{RootRecord: RootRecord{ID: id, State: state, CertSHA256: fingerprint(cert), PreparedAt: now, PublishedAt: now}, Cert: cert, Key: key}
	if state == StatePrepared {
		r.MinActivateAt = now.Add(PublishLead * a.cfg.RefreshHint)
	} else {
		r.ActivatedAt = now
	}
	a.roots = append(a.roots, r)
	a.journal.Sequence++
	event := "prepared (" + why + ")"
	if state == StateActive {
		event = "bootstrap"
	}
	a.event(now, event, id)
	return nil
}

func (a *Authority) event(now time.Time, what, id string) {
	a.journal.Events = append(a.journal.Events, JournalNote{At: now, Event: what, RootID: id})
	a.metrics.rotations.WithLabelValues(firstWord(what)).Inc()
	a.cfg.Logger.Info("CA root "+what, logattr.RootID, id, logattr.Sequence, a.journal.Sequence)
}

func firstWord(s string) string {
	for i, c := range s {
		if c == ' ' {
			return s[:i]
		}
	}
	return s
}

// commitLocked persists the journal and the roots' material, and
// publishes the new bundle. Only the leader writes: a replica that lost
// leadership since it decided writes nothing (and the backend checks
// again).
func (a *Authority) commitLocked() error {
	if !a.leading() {
		return fmt.Errorf("ca: %w: not writing CA state to %s", ErrNotLeader, a.backend.Describe())
	}
	a.journal.Roots = a.journal.Roots[:0]
	for _, r := range a.roots {
		a.journal.Roots = append(a.journal.Roots, r.RootRecord)
	}
	a.journal.Updated = a.cfg.Clock.Now()
	if s := int64(a.cfg.MaxWorkloadTTL / time.Second); s > a.journal.MaxWorkloadTTLSeconds {
		a.journal.MaxWorkloadTTLSeconds = s
	}
	st := a.settings()
	a.journal.Settings = &st
	version, err := a.backend.Commit(a.version, a.journal, a.roots)
	if err != nil {
		return err
	}
	a.version = version
	for _, r := range a.roots {
		// Roots this commit publishes were published when decided, in this
		// critical section.
		if _, ok := a.served[r.ID]; !ok && !r.PublishedAt.IsZero() {
			a.served[r.ID] = r.PublishedAt
		}
	}
	a.publishLocked()
	return nil
}

func (a *Authority) publishLocked() {
	if len(a.roots) == 0 && a.cfg.Plugin == nil {
		// No state yet (a follower before the leader wrote it): nothing
		// to publish.
		return
	}
	now := a.cfg.Clock.Now()
	current := make(map[string]bool, len(a.roots))
	certs := make([]*x509.Certificate, 0, len(a.roots))
	for _, r := range a.roots {
		certs = append(certs, r.Cert)
		current[r.ID] = true
		if _, ok := a.served[r.ID]; !ok {
			a.served[r.ID] = now
		}
	}
	for id := range a.served {
		if !current[id] {
			delete(a.served, id)
		}
	}
	b := spiffebundle.FromX509Authorities(a.cfg.TrustDomain, certs)
	b.SetSequenceNumber(a.journal.Sequence)
	b.SetRefreshHint(a.cfg.RefreshHint)
	changed := a.bundle == nil || !a.bundle.Equal(b)
	a.bundle = b
	a.metrics.observe(a.roots, a.journal.Sequence)
	states := make([]string, 0, len(a.roots))
	for _, r := range a.roots {
		states = append(states, r.ID+"="+string(r.State))
	}
	stateKey := strings.Join(states, ",")
	stateChanged := stateKey != a.published
	a.published = stateKey
	notify := a.subs
	if changed {
		notify = append([]chan struct{}{a.changes}, a.subs...)
	} else if !stateChanged {
		notify = nil
	}
	for _, ch := range notify {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// newRootCert mints a self-signed root for td. Its subject carries the
// serial number so that no two roots share a subject: Go's chain builder
// gives up after a fixed number of signature checks per candidate subject,
// which broke SPIRE deployments with many same-named roots.
func newRootCert(td spiffeid.TrustDomain, kt KeyType, now time.Time, ttl time.Duration) (*x509.Certificate, crypto.Signer, error) {
	key, err := GenerateKey(kt)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}
	serial.SetBit(serial, 127, 1) // fixed length keeps ids uniform
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{td.Name()},
			CommonName:   "trustbridge root CA",
			SerialNumber: serial.Text(16),
		},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(ttl),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{td.ID().URL()},
		// Verifiers that honour name constraints refuse anything this root
		// signs for another trust domain.
		PermittedURIDomains: []string{td.Name()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// Ready reports why the CA cannot sign, or nil. In plug-in mode a bad
// change to the directory makes it not ready, though it keeps signing
// with the last good material: operators must see the error.
func (a *Authority) Ready() error {
	if a.cfg.Plugin != nil {
		if err := a.cfg.Plugin.LastError(); err != nil {
			return fmt.Errorf("%w (still signing with the last good material)", err)
		}
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.lastErr != nil {
		return fmt.Errorf("last CA check failed: %w", a.lastErr)
	}
	m, err := a.signingMaterialLocked()
	if err != nil {
		return err
	}
	if now := a.cfg.Clock.Now(); now.After(m.Cert.NotAfter) {
		return fmt.Errorf("ca: active root %s expired at %s", fingerprint(m.Cert)[:16], m.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// readinessGauge is 1 while Ready reports a problem, so alerts need not
// scrape /readyz.
func (a *Authority) readinessGauge() float64 {
	if a.Ready() != nil {
		return 1
	}
	return 0
}
