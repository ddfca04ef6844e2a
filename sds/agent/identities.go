package agent

import (
	"cmp"
	"container/list"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
	"github.com/trustbridge/trustbridge/sds"
)

// Defaults of IdentityCacheConfig.
const (
	// DefaultMaxIdentities bounds the identities one agent holds at once,
	// as SPIRE's agent bounds its SVID cache (x509_svid_cache_max_size,
	// 1,000): far more service accounts than a node runs pods of, yet a
	// bound on what a node's processes can make the agent hold and renew.
	DefaultMaxIdentities = 1000
	// DefaultIdentityLinger is how long an identity no process holds any
	// more is kept, and renewed, before it is dropped: a workload that
	// comes back within it (an Envoy restart, a stream re-opened after a
	// blip) gets the same certificate without a new request, while one
	// that has gone costs no renewal soon after.
	DefaultIdentityLinger = time.Minute
	// DefaultMaxConcurrentFetches bounds the requests to the certificate
	// service in flight (as ztunnel's SecretManager bounds its fetches): a
	// node starting many pods at once must not trip the server's signing
	// queue, which refuses the excess.
	DefaultMaxConcurrentFetches = 8
)

// Renewal timing of the identity cache.
const (
	// identityRenewJitter spreads renewals around the grace point, over
	// this fraction of the lifetime, so identities issued together (a node
	// starting) are not renewed in one burst.
	identityRenewJitter = 0.1
	identityRetryBase   = time.Second
	identityRetryMax    = 2 * time.Minute
	identityCallTimeout = 30 * time.Second
	// identityLogEvery bounds the lines about failing renewals: an outage
	// of the server fails every identity's.
	identityLogEvery = 10 * time.Second
	// refusalMemory is how long a first fetch the server refused
	// (PermissionDenied) is answered from memory: a process reconnecting
	// in a loop costs the server one request per this, not one per
	// connection. A pod that just started (the server's informer a step
	// behind the agent's) waits at most this long.
	refusalMemory = 5 * time.Second
)

var (
	// ErrIdentityCacheFull refuses a new identity when the cache holds its
	// maximum and every identity in it is held by a process.
	ErrIdentityCacheFull = errors.New("identity cache full: every identity it holds is in use")
	// ErrCredentialExpired means the certificate of an identity expired
	// before it could be renewed; nothing is served until a renewal
	// succeeds.
	ErrCredentialExpired = errors.New("the certificate expired and could not be renewed")
	// ErrIdentityRevoked means the server refused the identity to this
	// node (a renewal, or its trust stream, answered PermissionDenied):
	// nothing is served for it any more, and a new holder asks again.
	ErrIdentityRevoked = errors.New("the server no longer grants this identity to this node")
	// ErrIdentityReleased is returned by a released IdentityHandle.
	ErrIdentityReleased = errors.New("identity handle released")
	// ErrIdentityCacheStopped refuses Acquire once Run has returned.
	ErrIdentityCacheStopped = errors.New("identity cache stopped")
	// errUnusable marks a certificate the server issued that fails the
	// agent's checks.
	errUnusable = errors.New("unusable certificate")
)

// IdentityFetcher obtains a certificate chain (leaf first, no roots) for
// id and key's public key, checked. *ImpersonationFetcher implements it.
type IdentityFetcher interface {
	FetchX509SVID(ctx context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error)
}

// IdentityRequest is one identity a node agent's workload runs as, as
// the identity map gives it: a SPIFFE ID, the DNS names its certificate
// carries beside it and the lifetime to ask for.
type IdentityRequest struct {
	ID spiffeid.ID
	// DNSNames are sorted, each once (identitymap.Identity's). The same ID
	// with other names is another certificate: a workload never gets a
	// name the map gave another one.
	DNSNames []string
	// TTL is the lifetime to ask for; zero leaves it to the fetcher. The
	// latest asked for an identity applies from its next fetch.
	TTL time.Duration
}

// identityKey is what an entry of the cache is for: an ID and its DNS
// names, joined.
type identityKey struct {
	id       spiffeid.ID
	dnsNames string
}

func (r IdentityRequest) key() identityKey {
	return identityKey{id: r.ID, dnsNames: strings.Join(r.DNSNames, ",")}
}

// IdentityRequestFetcher is an IdentityFetcher that can ask for an
// IdentityRequest's DNS names and lifetime. Without one, a request with
// DNS names fails.
type IdentityRequestFetcher interface {
	FetchIdentity(ctx context.Context, req IdentityRequest, key crypto.Signer) ([]*x509.Certificate, error)
}

// IdentityFetcherFunc adapts a function to IdentityFetcher.
type IdentityFetcherFunc func(ctx context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error)

// FetchX509SVID calls f.
func (f IdentityFetcherFunc) FetchX509SVID(ctx context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error) {
	return f(ctx, id, key)
}

// IdentityCacheConfig configures an IdentityCache. Fetcher is required;
// zero values mean the defaults.
type IdentityCacheConfig struct {
	Fetcher IdentityFetcher
	// MaxIdentities bounds the identities held; DefaultMaxIdentities when
	// zero.
	MaxIdentities int
	// Linger is how long an identity nobody holds is kept;
	// DefaultIdentityLinger when zero.
	Linger time.Duration
	// MaxConcurrentFetches bounds the requests in flight;
	// DefaultMaxConcurrentFetches when zero.
	MaxConcurrentFetches int
	// GraceRatio places each renewal at NotBefore + GraceRatio*lifetime,
	// give or take 5% of the lifetime; 0.5 when zero, else in [0.1, 0.9].
	GraceRatio float64
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Rand returns numbers in [0, 1) for jitter; math/rand/v2's Float64
	// when nil. It must be safe for concurrent use.
	Rand   func() float64
	Logger *slog.Logger
	// Registerer receives the trustbridge_agent_identity_* metrics; nil
	// registers nowhere.
	Registerer prometheus.Registerer
	// Companion, when set, runs beside each SPIFFE ID for as long as the
	// cache holds a certificate of it (of any DNS names), in a goroutine
	// of its own, from the moment the first arrived: its ctx ends when the
	// last is dropped (it lingered unheld, was evicted or revoked) or the
	// cache stops, and Run waits for it to return. A node agent follows
	// each workload's trust with it.
	Companion func(ctx context.Context, id spiffeid.ID)
}

// IdentityCache holds the X509-SVIDs of the identities a node agent's
// workloads run as: one certificate per identity, shared by every process
// with that identity, fetched on first use, renewed at its grace point,
// dropped a while after its last holder released it. Its keys never leave
// it but through each holder's own handle. Build it with
// NewIdentityCache and run it with Run; Acquire may be called from any
// goroutine.
type IdentityCache struct {
	fetcher   IdentityFetcher
	companion func(ctx context.Context, id spiffeid.ID)
	max       int
	linger    time.Duration
	grace     float64
	clock     clock.Clock
	rand      func() float64
	log       *slog.Logger
	failLog   *ratelimit.LogLimiter
	metrics   *identityMetrics
	sem       chan struct{} // one slot per fetch in flight

	// retry spaces failed renewals.
	retry loop.Backoff

	// taints is the taint set in force (setTaints); taintReissues, when
	// set, counts the re-issues it caused.
	taints        atomic.Pointer[taintSet]
	taintReissues prometheus.Counter

	started chan struct{} // closed by Run once runCtx is set
	runCtx  context.Context
	wg      sync.WaitGroup // one per entry's maintain goroutine and companion

	mu      sync.Mutex
	entries map[identityKey]*identityEntry
	// refused are the identities whose first fetch the server refused
	// lately, with when to ask again and why; at most max.
	refused map[identityKey]refusedIdentity
	// companions run one per ID that has a certificate.
	companions map[spiffeid.ID]*companionRun
	idle       list.List // of *identityEntry nobody holds, least recently released first
	stopped    bool
}

// NewIdentityCache checks cfg and applies its defaults. It starts
// nothing.
func NewIdentityCache(cfg IdentityCacheConfig) (*IdentityCache, error) {
	if cfg.Fetcher == nil {
		return nil, errors.New("agent: identity cache: no fetcher")
	}
	if cfg.MaxIdentities < 0 || cfg.Linger < 0 || cfg.MaxConcurrentFetches < 0 {
		return nil, fmt.Errorf("agent: identity cache: maximum identities (%d), linger (%s) and concurrent fetches (%d) must not be negative",
			cfg.MaxIdentities, cfg.Linger, cfg.MaxConcurrentFetches)
	}
	grace := cmp.Or(cfg.GraceRatio, defaultGraceRatio)
	if !(grace >= 0.1 && grace <= 0.9) {
		return nil, fmt.Errorf("agent: identity cache: grace ratio %v must be between 0.1 and 0.9", cfg.GraceRatio)
	}
	m, err := newIdentityMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("agent: identity cache: %w", err)
	}
	c := &IdentityCache{
		fetcher:   cfg.Fetcher,
		companion: cfg.Companion,
		max:       cmp.Or(cfg.MaxIdentities, DefaultMaxIdentities),
		linger:    cmp.Or(cfg.Linger, DefaultIdentityLinger),
		grace:     grace,
		clock:     cfg.Clock,
		rand:      cfg.Rand,
		log:       cfg.Logger,
		failLog:   ratelimit.NewLogLimiter(identityLogEvery, 1),
		metrics:   m,
		sem:       make(chan struct{}, cmp.Or(cfg.MaxConcurrentFetches, DefaultMaxConcurrentFetches)),
		retry:     loop.Backoff{Base: identityRetryBase, Max: identityRetryMax, Jitter: retryJitter},
		started:   make(chan struct{}),
		entries:   make(map[identityKey]*identityEntry),
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	if c.rand == nil {
		c.rand = mathrand.Float64
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Run lets Acquire fetch and renew identities until ctx is done, then
// stops every renewal and returns nil once none runs. Handles acquired
// before keep serving their last certificate until it expires; Acquire
// fails from then on.
func (c *IdentityCache) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.runCtx != nil {
		c.mu.Unlock()
		return errors.New("agent: identity cache: Run called twice")
	}
	c.runCtx = ctx
	close(c.started)
	c.mu.Unlock()

	<-ctx.Done()
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}

// Acquire returns a handle on id's credential for one process, fetching
// it first when no process holds id yet (concurrent Acquires of one id
// share that fetch). It waits for Run to start and for the first fetch,
// or until ctx is done. A failed first fetch leaves nothing behind and
// its error goes to every Acquire that waited for it. When the cache holds
// its maximum, the identity released longest ago is dropped to make room;
// when every identity is held, Acquire fails with ErrIdentityCacheFull.
// Call Release on the handle when the process is gone.
func (c *IdentityCache) Acquire(ctx context.Context, id spiffeid.ID) (*IdentityHandle, error) {
	return c.AcquireIdentity(ctx, IdentityRequest{ID: id})
}

// AcquireIdentity is Acquire for req: its ID with its DNS names (another
// certificate than the same ID's with other names), asking for its TTL
// when it has one.
func (c *IdentityCache) AcquireIdentity(ctx context.Context, req IdentityRequest) (*IdentityHandle, error) {
	id := req.ID
	if id.IsZero() || id.Path() == "" {
		return nil, fmt.Errorf("agent: identity %q is not a SPIFFE ID of a workload", id.String())
	}
	select {
	case <-c.started:
	case <-ctx.Done():
		return nil, fmt.Errorf("agent: identity %s: %w", id, ctx.Err())
	}
	e, err := c.ref(req)
	if err != nil {
		return nil, fmt.Errorf("agent: identity %s: %w", id, err)
	}
	select {
	case <-e.ready:
	case <-ctx.Done():
		c.unref(e)
		return nil, fmt.Errorf("agent: identity %s: %w", id, ctx.Err())
	}
	if e.firstErr != nil {
		return nil, fmt.Errorf("agent: identity %s: %w", id, e.firstErr)
	}
	return &IdentityHandle{c: c, e: e}, nil
}

// ref takes a reference on req's entry, making it (and its maintain
// goroutine) when there is none, and room for it when needed.
func (c *IdentityCache) ref(req IdentityRequest) (*identityEntry, error) {
	key, ttl := req.key(), req.TTL
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, ErrIdentityCacheStopped
	}
	if e, ok := c.entries[key]; ok {
		if ttl != 0 {
			e.ttl.Store(int64(ttl))
		}
		if e.refs == 0 {
			c.idle.Remove(e.idleAt)
			e.idleAt = nil
			e.poke()
		}
		e.refs++
		return e, nil
	}
	if err := c.recentRefusalLocked(key); err != nil {
		return nil, fmt.Errorf("refused by the server moments ago, asking again in at most %s: %w", refusalMemory, err)
	}
	if len(c.entries) >= c.max {
		front := c.idle.Front()
		if front == nil {
			c.metrics.refusals.Inc()
			return nil, fmt.Errorf("%w (%d identities)", ErrIdentityCacheFull, c.max)
		}
		victim := front.Value.(*identityEntry)
		c.dropLocked(victim)
		c.metrics.evictions.Inc()
		c.log.Info("identity evicted to make room", logattr.SPIFFEID, victim.id.String(), "max_identities", c.max)
	}
	ctx, cancel := context.WithCancel(c.runCtx)
	e := &identityEntry{id: req.ID, ident: key, dnsNames: slices.Clone(req.DNSNames), refs: 1, maintained: true,
		ready: make(chan struct{}), pokes: make(chan struct{}, 1), cancel: cancel}
	e.ttl.Store(int64(ttl))
	e.state.Store(&identityState{err: sds.ErrNoCredential, changed: make(chan struct{})})
	c.entries[key] = e
	c.metrics.entries.Set(float64(len(c.entries)))
	c.wg.Add(1)
	go c.maintain(ctx, e)
	return e, nil
}

// refusedIdentity is a server refusal remembered until again.
type refusedIdentity struct {
	err   error
	again time.Time
}

// rememberRefusal keeps a PermissionDenied first fetch of id for
// refusalMemory. c.mu is held.
func (c *IdentityCache) rememberRefusalLocked(id identityKey, err error) {
	if status.Code(err) != codes.PermissionDenied {
		return
	}
	now := c.clock.Now()
	if c.refused == nil {
		c.refused = make(map[identityKey]refusedIdentity)
	}
	if len(c.refused) >= c.max {
		for k, r := range c.refused {
			if !now.Before(r.again) {
				delete(c.refused, k)
			}
		}
		if len(c.refused) >= c.max {
			clear(c.refused)
		}
	}
	c.refused[id] = refusedIdentity{err: err, again: now.Add(refusalMemory)}
}

// recentRefusal is id's remembered refusal, if still in force. c.mu is
// held.
func (c *IdentityCache) recentRefusalLocked(id identityKey) error {
	r, ok := c.refused[id]
	if !ok {
		return nil
	}
	if !c.clock.Now().Before(r.again) {
		delete(c.refused, id)
		return nil
	}
	return r.err
}

// unref gives back a reference; the last one starts the entry's linger.
func (c *IdentityCache) unref(e *identityEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	switch {
	case e.refs > 0:
	case e.dropped:
		c.zeroIfUnusedLocked(e)
	default:
		e.releasedAt = c.clock.Now()
		e.idleAt = c.idle.PushBack(e)
		e.poke()
	}
}

// zeroIfUnusedLocked zeroes e's key once nobody can read it any more: e
// was dropped, its maintain goroutine (which writes the key) has ended and
// its last holder let go. A revoked identity is dropped while held: its
// holders may be sending the key at that moment. c.mu is held.
func (c *IdentityCache) zeroIfUnusedLocked(e *identityEntry) {
	if e.dropped && e.refs == 0 && !e.maintained {
		zeroKey(e.key)
	}
}

// dropLocked removes e from the cache and stops its renewals; its key is
// zeroed once nobody uses it (zeroIfUnusedLocked). c.mu is held.
func (c *IdentityCache) dropLocked(e *identityEntry) {
	if e.dropped {
		return
	}
	e.dropped = true
	if e.idleAt != nil {
		c.idle.Remove(e.idleAt)
		e.idleAt = nil
	}
	if c.entries[e.ident] == e {
		delete(c.entries, e.ident)
	}
	c.metrics.entries.Set(float64(len(c.entries)))
	e.cancel()
}

// identityEntry is one identity in the cache. The fields under "c.mu"
// are guarded by the cache's mutex; key and stale belong to the entry's
// maintain goroutine.
type identityEntry struct {
	id       spiffeid.ID
	ident    identityKey // id and dnsNames, its key in the cache
	dnsNames []string
	cancel   context.CancelFunc // stops the maintain goroutine
	pokes    chan struct{}      // cap 1: refs changed, recompute the wake-up

	// ready is closed when the first fetch ended; firstErr is set before
	// when it failed.
	ready    chan struct{}
	firstErr error
	state    atomic.Pointer[identityState]
	// ttl is the lifetime to ask for (0: the fetcher's), a Duration.
	ttl atomic.Int64

	// c.mu
	refs       int
	idleAt     *list.Element // in IdentityCache.idle while refs == 0
	releasedAt time.Time
	dropped    bool
	maintained bool // its maintain goroutine runs

	// the maintain goroutine's (key read under c.mu once it ended)
	key   *ecdsa.PrivateKey
	stale bool
}

// identityState is what an entry serves at one moment: a credential or
// why there is none, and a channel closed when that changes. It is never
// changed once published.
type identityState struct {
	cred    *sds.Credential
	err     error
	changed chan struct{}
}

func (e *identityEntry) poke() {
	select {
	case e.pokes <- struct{}{}:
	default:
	}
}

// publish replaces what e serves and wakes its watchers.
func (e *identityEntry) publish(cred *sds.Credential, err error) {
	next := &identityState{cred: cred, err: err, changed: make(chan struct{})}
	if cred != nil {
		cred.Changed = next.changed
	}
	close(e.state.Swap(next).changed)
}

// maintain fetches e's first certificate, then renews it until e is
// dropped or the cache stops.
func (c *IdentityCache) maintain(ctx context.Context, e *identityEntry) {
	defer c.wg.Done()
	defer func() {
		if c.runCtx.Err() != nil {
			return // stopped, not dropped: holders may still send its key
		}
		if e.stale {
			c.metrics.stale.Dec()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		e.maintained = false
		c.zeroIfUnusedLocked(e)
	}()
	chain, err := c.fetch(ctx, e)
	if err != nil {
		c.mu.Lock()
		c.dropLocked(e)
		c.rememberRefusalLocked(e.ident, err)
		c.mu.Unlock()
		e.firstErr = err
		e.publish(nil, err)
		close(e.ready)
		c.log.Log(ctx, c.failLog.Level(slog.LevelWarn), "no certificate for this identity", e.logAttrs(logattr.Error, err.Error())...)
		return
	}
	close(e.ready)
	// Only for an identity the server granted: a refused one costs one
	// request, not a stream besides.
	c.startCompanion(e.id)
	defer c.stopCompanion(e.id)
	c.renewLoop(ctx, e, chain)
}

// companionRun is the Companion of one ID: how many entries of it (one
// per set of DNS names) have a certificate, and how to stop it.
type companionRun struct {
	entries int
	cancel  context.CancelFunc
}

// startCompanion counts an entry of id that has its certificate, starting
// id's Companion with the first. Run waits for it: the caller, a maintain
// goroutine, keeps the group open while it adds to it.
func (c *IdentityCache) startCompanion(id spiffeid.ID) {
	if c.companion == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.companions[id]; r != nil {
		r.entries++
		return
	}
	ctx, cancel := context.WithCancel(c.runCtx)
	if c.companions == nil {
		c.companions = make(map[spiffeid.ID]*companionRun)
	}
	c.companions[id] = &companionRun{entries: 1, cancel: cancel}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.companion(ctx, id)
	}()
}

// stopCompanion uncounts an entry of id, stopping id's Companion with the
// last.
func (c *IdentityCache) stopCompanion(id spiffeid.ID) {
	if c.companion == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.companions[id]; r != nil {
		if r.entries--; r.entries == 0 {
			r.cancel()
			delete(c.companions, id)
		}
	}
}

// renewLoop renews e's certificate, whose chain is chain, at its grace
// point, or sooner when a taint asks for it; after a failure it keeps
// serving the certificate until it expires and retries with backoff. It
// returns when e is dropped at the end of its linger, or ctx is done.
func (c *IdentityCache) renewLoop(ctx context.Context, e *identityEntry, chain []*x509.Certificate) {
	leaf := chain[0]
	next := c.nextRenewal(leaf)
	var taint taintDue
	c.judgeIssued(&taint, chain)
	expired := false
	for failures := 0; ; {
		c.judgeTaints(&taint, chain)
		wake := taint.wake(next)
		if !expired && leaf.NotAfter.Before(wake) {
			wake = leaf.NotAfter
		}
		if d, ok := c.lingerEnd(e); ok && d.Before(wake) {
			wake = d
		}
		if !c.waitUntil(ctx, e, wake) {
			return
		}
		now := c.clock.Now()
		if c.dropIfLingered(e, now) {
			return
		}
		if tainted := taint.take(now); !tainted && now.Before(next) {
			if !expired && !now.Before(leaf.NotAfter) {
				expired = true
				c.expire(e, leaf)
			}
			continue
		}
		fresh, err := c.fetch(ctx, e)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			chain, leaf, expired, failures = fresh, fresh[0], false, 0
			next = c.nextRenewal(leaf)
			c.setStale(e, false)
			c.metrics.renewals.Inc()
			c.judgeIssued(&taint, chain)
			continue
		}
		if status.Code(err) == codes.PermissionDenied {
			// The server decided: this node may no longer have it (its
			// pod left, the operator's list changed). Served no longer.
			c.revoke([]*identityEntry{e}, err)
			return
		}
		failures++
		next = now.Add(c.retry.Delay(failures, c.rand()))
		c.setStale(e, !expired)
		c.log.Log(ctx, c.failLog.Level(slog.LevelError), "renewing an identity's certificate failed; serving the last one until it expires",
			e.logAttrs("not_after", leaf.NotAfter.UTC().Format(time.RFC3339), logattr.Error, err.Error(), "retry_in", next.Sub(now))...)
	}
}

// judgeTaints schedules the re-issue of chain when a new taint set
// taints it.
func (c *IdentityCache) judgeTaints(d *taintDue, chain []*x509.Certificate) {
	if set := c.taints.Load(); set != nil {
		d.onSet(chain, *set, c.clock.Now(), c.rand())
	}
}

// judgeIssued judges a chain just issued against the taints in force,
// counting the re-issue a taint asked for.
func (c *IdentityCache) judgeIssued(d *taintDue, chain []*x509.Certificate) {
	var set taintSet
	if p := c.taints.Load(); p != nil {
		set = *p
	}
	if d.onIssued(chain, set, c.clock.Now(), c.retry, c.rand()) && c.taintReissues != nil {
		c.taintReissues.Inc()
	}
}

// setTaints makes set the taints in force: every entry judges its
// certificate against it, re-issuing it within the set's spread when a
// tainted authority signed it. It returns how many certificates it
// taints. A taintFollower.
func (c *IdentityCache) setTaints(set taintSet) int {
	c.taints.Store(&set)
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.entries {
		if st := e.state.Load(); st.cred != nil && set.signed(st.cred.Chain) {
			n++
		}
		e.poke()
	}
	return n
}

// Revoke stops serving id (with any DNS names) at once, because the
// server refused it to this node (why): every holder's Credential fails
// with ErrIdentityRevoked, its key is zeroed once the last holder lets
// go, and the next Acquire asks the server again. Nothing happens when id
// is not held.
func (c *IdentityCache) Revoke(id spiffeid.ID, why error) {
	c.mu.Lock()
	var of []*identityEntry
	for _, e := range c.entries {
		if e.id == id {
			of = append(of, e)
		}
	}
	c.mu.Unlock()
	c.revoke(of, why)
}

// revoke is Revoke of entries. A renewal the server refused revokes its
// entry only: the same ID with other DNS names is decided on its own.
func (c *IdentityCache) revoke(entries []*identityEntry, why error) {
	c.mu.Lock()
	for _, e := range entries {
		c.dropLocked(e)
		c.rememberRefusalLocked(e.ident, why)
	}
	c.mu.Unlock()
	for _, e := range entries {
		e.publish(nil, fmt.Errorf("%w: %w", ErrIdentityRevoked, why))
		c.metrics.revocations.Inc()
		c.log.Warn("the server no longer grants this identity to this node; serving it no longer", e.logAttrs(logattr.Error, why.Error())...)
	}
}

// logAttrs are e's ID, its DNS names when it has any, then attrs.
func (e *identityEntry) logAttrs(attrs ...any) []any {
	out := []any{logattr.SPIFFEID, e.id.String()}
	if len(e.dnsNames) > 0 {
		out = append(out, logattr.DNSNames, e.dnsNames)
	}
	return append(out, attrs...)
}

// expire stops serving e's certificate, whose leaf expired unrenewed.
func (c *IdentityCache) expire(e *identityEntry, leaf *x509.Certificate) {
	c.setStale(e, false)
	c.metrics.expirations.Inc()
	e.publish(nil, fmt.Errorf("%w at %s", ErrCredentialExpired, leaf.NotAfter.UTC().Format(time.RFC3339)))
	c.log.Log(context.Background(), c.failLog.Level(slog.LevelError), "an identity's certificate expired before it could be renewed; serving none",
		logattr.SPIFFEID, e.id.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
}

func (c *IdentityCache) setStale(e *identityEntry, stale bool) {
	switch {
	case stale && !e.stale:
		c.metrics.stale.Inc()
	case !stale && e.stale:
		c.metrics.stale.Dec()
	}
	e.stale = stale
}

// lingerEnd is when e, held by nobody, is to be dropped.
func (c *IdentityCache) lingerEnd(e *identityEntry) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.refs > 0 || e.dropped {
		return time.Time{}, false
	}
	return e.releasedAt.Add(c.linger), true
}

// dropIfLingered drops e if nobody has held it for the linger at now.
func (c *IdentityCache) dropIfLingered(e *identityEntry, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.refs > 0 || e.dropped || now.Before(e.releasedAt.Add(c.linger)) {
		return false
	}
	c.dropLocked(e)
	return true
}

// waitUntil waits until at, or a poke (true: recompute), or ctx done
// (false). Like sleepUntil it checks the time after arming the timer.
func (c *IdentityCache) waitUntil(ctx context.Context, e *identityEntry, at time.Time) bool {
	d := at.Sub(c.clock.Now())
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := c.clock.NewTimer(d)
	defer t.Stop()
	if !c.clock.Now().Before(at) {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-e.pokes:
	case <-t.C():
	}
	return true
}

// fetch obtains a certificate for e with a fresh key, checks it and
// publishes it, returning its chain. The work runs on a goroutine of its
// own: key generation, signing and gRPC grow a stack to several KiB, which
// the long-lived maintain goroutine, one per identity, would then keep.
func (c *IdentityCache) fetch(ctx context.Context, e *identityEntry) ([]*x509.Certificate, error) {
	type result struct {
		chain []*x509.Certificate
		err   error
	}
	done := make(chan result, 1)
	go func() {
		chain, err := c.fetchNow(ctx, e)
		done <- result{chain, err}
	}()
	r := <-done
	return r.chain, r.err
}

// fetchNow is fetch on the calling goroutine.
func (c *IdentityCache) fetchNow(ctx context.Context, e *identityEntry) (_ []*x509.Certificate, err error) {
	defer func() { c.metrics.fetches.WithLabelValues(fetchResult(err)).Inc() }()
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.sem }()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	callCtx, cancel := context.WithTimeout(ctx, identityCallTimeout)
	defer cancel()
	chain, err := c.fetchChain(callCtx, e, key)
	if err == nil {
		err = checkFetched(chain, key, e.id, e.dnsNames, c.clock.Now())
	}
	if err != nil {
		zeroKey(key)
		return nil, err
	}
	// The previous key is left to the collector, not zeroed: a stream may
	// still be sending the credential it belongs to.
	e.key = key
	e.publish(&sds.Credential{Chain: chain, Key: key}, nil)
	return chain, nil
}

// fetchChain asks the fetcher for e's certificate for key, with e's DNS
// names and TTL when the fetcher takes them. A fetcher that cannot ask
// for DNS names gets no request for an entry that has some: the workload
// would be served a certificate without the names the map gives it.
func (c *IdentityCache) fetchChain(ctx context.Context, e *identityEntry, key crypto.Signer) ([]*x509.Certificate, error) {
	if f, ok := c.fetcher.(IdentityRequestFetcher); ok {
		return f.FetchIdentity(ctx, IdentityRequest{ID: e.id, DNSNames: e.dnsNames, TTL: time.Duration(e.ttl.Load())}, key)
	}
	if len(e.dnsNames) > 0 {
		return nil, fmt.Errorf("agent: the certificate fetcher (%T) cannot ask for the DNS names %s", c.fetcher, strings.Join(e.dnsNames, ", "))
	}
	return c.fetcher.FetchX509SVID(ctx, e.id, key)
}

// checkFetched refuses a chain whose leaf is not an X509-SVID of id with
// dnsNames (the server may add its own) for key, valid at now. The
// fetcher checks as much and more (the chain to the roots); this keeps a
// faulty fetcher from handing a process another identity, or an expired
// one.
func checkFetched(chain []*x509.Certificate, key *ecdsa.PrivateKey, id spiffeid.ID, dnsNames []string, now time.Time) error {
	if len(chain) == 0 || chain[0] == nil {
		return fmt.Errorf("%w: no certificate", errUnusable)
	}
	leaf := chain[0]
	got, err := x509svid.IDFromCert(leaf)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", errUnusable, err)
	case got != id:
		return fmt.Errorf("%w: issued for %s, asked for %s", errUnusable, got, id)
	case leaf.IsCA:
		return fmt.Errorf("%w: a CA certificate", errUnusable)
	case !key.PublicKey.Equal(leaf.PublicKey):
		return fmt.Errorf("%w: not for the key the request sent", errUnusable)
	case !now.Before(leaf.NotAfter):
		return fmt.Errorf("%w: expired at %s", errUnusable, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	for _, n := range dnsNames {
		if !slices.Contains(leaf.DNSNames, n) {
			return fmt.Errorf("%w: without the DNS name %s it was asked for", errUnusable, n)
		}
	}
	return nil
}

// nextRenewal is when to renew the certificate whose leaf was just
// fetched: renewAt, unless that has passed (a leaf backdated or mostly
// spent, a clock off), then the grace point of what is left of it, and
// never sooner than retry.Base from now, so a server handing out such
// leaves is not asked again in a tight loop.
func (c *IdentityCache) nextRenewal(leaf *x509.Certificate) time.Time {
	now := c.clock.Now()
	at := renewAt(leaf.NotBefore, leaf.NotAfter, c.grace, c.rand())
	if at.Before(now) {
		at = gracePoint(now, leaf.NotAfter, c.grace)
	}
	return maxTime(at, now.Add(c.retry.Base))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// renewAt is the renewal time of a certificate valid from notBefore to
// notAfter: its grace point, moved by jitter (in [0, 1)) within
// identityRenewJitter of the lifetime around it.
func renewAt(notBefore, notAfter time.Time, grace, jitter float64) time.Time {
	return gracePoint(notBefore, notAfter, grace+identityRenewJitter*(jitter-0.5))
}

// fetchResult is the metric label of a fetch's outcome.
func fetchResult(err error) string {
	switch {
	case err == nil:
		return resultSuccess
	case errors.Is(err, errUnusable):
		return "unusable"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "unavailable"
	}
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return "refused"
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return "unavailable"
	}
	return "error"
}

// zeroKey overwrites k's private scalar, as far as Go allows: copies made
// inside crypto/ecdsa (its precomputed form) are out of reach.
func zeroKey(k *ecdsa.PrivateKey) {
	if k == nil {
		return
	}
	//lint:ignore SA1019 zeroing the scalar needs the one field that holds it
	d := k.D
	if d != nil {
		clear(d.Bits())
		d.SetInt64(0)
	}
}

// IdentityHandle is one process's hold on an identity of the cache. It is
// an sds.CredentialSource for that identity only.
type IdentityHandle struct {
	c        *IdentityCache
	e        *identityEntry
	released atomic.Bool
}

// ID is the identity held.
func (h *IdentityHandle) ID() spiffeid.ID { return h.e.id }

// DNSNames are the DNS names its certificate carries beside the ID (the
// server may add its own).
func (h *IdentityHandle) DNSNames() []string { return slices.Clone(h.e.dnsNames) }

// holds reports whether h is a hold on req's identity: its ID with
// exactly its DNS names.
func (h *IdentityHandle) holds(req IdentityRequest) bool { return h.e.ident == req.key() }

// Credential returns the identity's current certificate and key, whose
// Changed is closed when it is renewed or expires; an error while there
// is none (ErrCredentialExpired), for any other id, and once released.
// An expired certificate is never returned.
func (h *IdentityHandle) Credential(_ context.Context, id spiffeid.ID) (*sds.Credential, error) {
	if h.released.Load() {
		return nil, ErrIdentityReleased
	}
	if id != h.e.id {
		return nil, fmt.Errorf("agent: this handle holds %s, not %s", h.e.id, id)
	}
	st := h.e.state.Load()
	if st.cred == nil {
		return nil, st.err
	}
	if leaf := st.cred.Chain[0]; !h.c.clock.Now().Before(leaf.NotAfter) {
		// The maintain goroutine publishes the expiry at NotAfter; a caller
		// that comes first must not get the certificate either.
		return nil, fmt.Errorf("%w at %s", ErrCredentialExpired, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return st.cred, nil
}

// Changed is closed when what Credential returns changes: a renewal, an
// expiry.
func (h *IdentityHandle) Changed() <-chan struct{} {
	return h.e.state.Load().changed
}

// hold is another hold on h's entry, which may have been dropped since
// (revoked): for a goroutine that reads h's credential on its own and
// must keep the key from being zeroed until it is done.
func (h *IdentityHandle) hold() *IdentityHandle {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.e.refs++
	return &IdentityHandle{c: h.c, e: h.e}
}

// Release gives the identity back; once nobody holds it, it is dropped
// after the cache's linger. Later calls do nothing.
func (h *IdentityHandle) Release() {
	if h.released.CompareAndSwap(false, true) {
		h.c.unref(h.e)
	}
}

type identityMetrics struct {
	entries     prometheus.Gauge
	fetches     *prometheus.CounterVec
	renewals    prometheus.Counter
	refusals    prometheus.Counter
	evictions   prometheus.Counter
	stale       prometheus.Gauge
	expirations prometheus.Counter
	revocations prometheus.Counter
}

func newIdentityMetrics(reg prometheus.Registerer) (*identityMetrics, error) {
	m := &identityMetrics{
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_agent_identity_entries",
			Help: "Workload identities the node agent holds a certificate for, held by a process or lingering.",
		}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_agent_identity_fetches_total",
			Help: "Requests for a workload identity's certificate, first ones and renewals, by result (success, refused, unavailable, unusable, canceled, error).",
		}, []string{"result"}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_identity_renewals_total",
			Help: "Renewed workload certificates pushed to the processes holding their identity.",
		}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_identity_refusals_total",
			Help: "Identities refused because the cache held its maximum and every identity in it was in use.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_identity_evictions_total",
			Help: "Identities nobody held that were dropped before their linger ended, to make room for another.",
		}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_agent_identity_stale",
			Help: "Identities whose renewal failed, served their last good certificate until it expires.",
		}),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_identity_expirations_total",
			Help: "Workload certificates that expired before they could be renewed; their identity is served nothing until a renewal succeeds.",
		}),
		revocations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_identity_revocations_total",
			Help: "Identities the server stopped granting to this node (PermissionDenied on a renewal or on their trust stream), no longer served.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.entries, m.fetches, m.renewals, m.refusals, m.evictions, m.stale, m.expirations, m.revocations} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}
