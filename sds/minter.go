package sds

import (
	"container/list"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/workloaddns"
)

// Minter defaults.
const (
	// DefaultGraceRatio is the fraction of a certificate's lifetime after
	// which it is replaced, as Istio's SECRET_GRACE_PERIOD_RATIO.
	DefaultGraceRatio = 0.5
	// DefaultMaxEntries bounds the identities whose credentials a Minter
	// keeps.
	DefaultMaxEntries = 10000
)

// MinterConfig configures NewMinter. Signer and TTL are required.
type MinterConfig struct {
	// Signer issues the certificates.
	Signer Signer
	// TTL is the lifetime asked for; it must be positive.
	TTL time.Duration
	// GraceRatio is the fraction of the lifetime after which a credential
	// is refreshed, in (0, 1]; zero means DefaultGraceRatio.
	GraceRatio float64
	// Clock; nil means the real clock.
	Clock clock.Clock
	// MaxEntries bounds the identities cached, the oldest minted being
	// forgotten first; zero means DefaultMaxEntries.
	MaxEntries int
	// WorkloadDNSNames, when set, gives the certificates of identities a
	// Kubernetes grant proved a DNS SAN from this template beside the
	// SPIFFE ID (see CredentialFor); Signer must then be a DNSSigner.
	WorkloadDNSNames *workloaddns.Template
	// Logger hears of identities WorkloadDNSNames gives no name; nil
	// discards.
	Logger *slog.Logger
	// Registerer, when set, gets
	// trustbridge_sds_workload_dns_names_total.
	Registerer prometheus.Registerer
}

// Minter is the server's CredentialSource: it generates an ECDSA P-256 key
// in-process, has Signer sign its public key for the authenticated id,
// and caches the credential per id until its RefreshAt. Concurrent requests for one id
// share one signing. Failures are not cached.
type Minter struct {
	cfg MinterConfig

	dnsNames *prometheus.CounterVec // by result; see WorkloadDNSNames

	mu      sync.Mutex
	entries map[mintKey]*mintEntry
	order   *list.List // of mintKey, oldest minted first
}

// mintKey is what a credential is minted for: the identity and the DNS
// names its grant gives it, so that a caller proved by a bootstrap token
// never receives the credential minted for a Kubernetes one of the same
// SPIFFE ID, with its DNS name.
type mintKey struct {
	id       spiffeid.ID
	dnsNames string // joined by ','
}

type mintEntry struct {
	cred     *Credential   // nil before the first success
	changed  chan struct{} // cred.Changed
	inflight chan struct{} // closed when the signing in progress ends; nil when none
	err      error         // of the last signing, for those who waited on it
	// expired is set by Expire: cred is minted anew at the next request,
	// however fresh it is. recheck is Expire's test for a signing that was
	// in progress when it ran: its result may be stale too.
	expired bool
	recheck func(*x509.Certificate) bool
	elem    *list.Element // in Minter.order
}

// NewMinter checks cfg and applies defaults.
func NewMinter(cfg MinterConfig) (*Minter, error) {
	if cfg.Signer == nil {
		return nil, errors.New("sds: minter: no signer")
	}
	if cfg.TTL <= 0 {
		return nil, fmt.Errorf("sds: minter: TTL %v must be positive", cfg.TTL)
	}
	if cfg.GraceRatio == 0 {
		cfg.GraceRatio = DefaultGraceRatio
	}
	if !(cfg.GraceRatio > 0 && cfg.GraceRatio <= 1) {
		return nil, fmt.Errorf("sds: minter: grace ratio %v must be in (0, 1]", cfg.GraceRatio)
	}
	if cfg.MaxEntries < 0 {
		return nil, fmt.Errorf("sds: minter: max entries %d must not be negative", cfg.MaxEntries)
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Minter{cfg: cfg, entries: make(map[mintKey]*mintEntry), order: list.New()}
	if err := m.initDNSNames(); err != nil {
		return nil, err
	}
	return m, nil
}

// Credential returns id's cached credential, or mints one when there is
// none or it is due for refresh. The caller must have proven id. The
// certificate carries no DNS names; the server asks CredentialFor.
func (m *Minter) Credential(ctx context.Context, id spiffeid.ID) (*Credential, error) {
	return m.credential(ctx, mintKey{id: id}, mintNames{})
}

// credential returns key's credential: the one held while it is fresh,
// else the one a signing already in progress makes, else a new one. One
// signing at a time per key.
func (m *Minter) credential(ctx context.Context, key mintKey, names mintNames) (*Credential, error) {
	id := key.id
	if id.IsZero() || id.Path() == "" {
		return nil, fmt.Errorf("sds: minter: %q is not a workload SPIFFE ID", id.String())
	}
	for {
		m.mu.Lock()
		e := m.entryLocked(key)
		if e.inflight == nil && e.cred != nil && !e.expired && m.cfg.Clock.Now().Before(e.cred.RefreshAt) {
			cred := e.cred
			m.mu.Unlock()
			return cred, nil
		}
		if wait := e.inflight; wait != nil {
			m.mu.Unlock()
			cred, err := m.await(ctx, e, wait)
			if err != nil || cred != nil {
				return cred, err
			}
			continue
		}
		done := make(chan struct{})
		e.inflight = done
		m.mu.Unlock()
		return m.refresh(key, e, done, names)
	}
}

// entryLocked returns key's entry, making it (and evicting the oldest
// beyond MaxEntries) when there is none. Called with mu held.
func (m *Minter) entryLocked(key mintKey) *mintEntry {
	e := m.entries[key]
	if e == nil {
		e = &mintEntry{}
		m.entries[key] = e
		e.elem = m.order.PushBack(key)
		m.evict()
	}
	return e
}

// await waits for the signing in progress on e (wait) to end, or ctx, and
// returns what it made: its error, or the credential. Both are nil when
// it made neither, and the caller tries again.
func (m *Minter) await(ctx context.Context, e *mintEntry, wait <-chan struct{}) (*Credential, error) {
	select {
	case <-wait:
	case <-ctx.Done():
		return nil, fmt.Errorf("sds: minter: %w", ctx.Err())
	}
	m.mu.Lock()
	cred, err := e.cred, e.err
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return cred, nil
}

// refresh signs a new credential for key, whose entry e has done as its
// signing in progress, records the result in e, and wakes those waiting:
// on done, and on the old credential's Changed when the signing succeeded.
func (m *Minter) refresh(key mintKey, e *mintEntry, done chan struct{}, names mintNames) (*Credential, error) {
	cred, err := m.mint(key.id, names)

	m.mu.Lock()
	defer m.mu.Unlock()
	defer close(done)
	e.inflight, e.err = nil, err
	recheck := e.recheck
	e.recheck = nil
	if err != nil {
		if e.expired && e.cred != nil && m.cfg.Clock.Now().Before(e.cred.Chain[0].NotAfter) {
			// Expired by a taint, not by time: the old credential is
			// still valid and stays served until a new one can be signed
			// (the next request tries again).
			e.err = nil
			return e.cred, nil
		}
		return nil, err
	}
	e.expired = recheck != nil && recheck(cred.Chain[0])
	if e.changed != nil {
		close(e.changed)
	}
	e.changed = make(chan struct{})
	cred.Changed = e.changed
	if e.expired {
		// Signed by a tainted authority while Expire ran: its holders
		// ask again at once, and get one minted anew.
		close(e.changed)
		e.changed = nil
	}
	e.cred = cred
	if m.entries[key] == e {
		m.order.MoveToBack(e.elem)
	}
	return cred, nil
}

// Expire has every credential whose leaf stale reports (signed by an
// authority an operator tainted) minted anew, and wakes the streams that
// hold one: each asks again, and gets a new credential. While a new one
// cannot be signed, the old one, still valid, is handed out again, and
// the next request tries again. A signing in progress is checked when it
// ends. It returns how many credentials it expired.
func (m *Minter) Expire(stale func(leaf *x509.Certificate) bool) int {
	m.mu.Lock()
	var wake []chan struct{}
	for _, e := range m.entries {
		if e.inflight != nil {
			e.recheck = stale
		}
		if e.cred == nil || e.expired || !stale(e.cred.Chain[0]) {
			continue
		}
		e.expired = true
		if e.changed != nil {
			// The holders' channel; the next credential gets a new one.
			wake = append(wake, e.changed)
			e.changed = nil
		}
	}
	m.mu.Unlock()
	for _, ch := range wake {
		close(ch)
	}
	return len(wake)
}

// evict forgets the oldest identities beyond MaxEntries. Their streams keep
// the credential they hold and ask again at its RefreshAt. Called with mu
// held.
func (m *Minter) evict() {
	for m.order.Len() > m.cfg.MaxEntries {
		front := m.order.Front()
		m.order.Remove(front)
		delete(m.entries, front.Value.(mintKey))
	}
}

// mint generates a key and has a certificate for id signed, with names.
func (m *Minter) mint(id spiffeid.ID, names mintNames) (*Credential, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sds: minter: generating a key for %s: %w", id, err)
	}
	chain, err := m.sign(key.Public(), id, names)
	if err != nil {
		return nil, fmt.Errorf("sds: minter: signing for %s: %w", id, err)
	}
	if err := checkCredential(chain, key, id); err != nil {
		return nil, fmt.Errorf("sds: minter: signer returned an unusable certificate for %s: %w", id, err)
	}
	// A certificate the signer cut short (its signing chain about to
	// expire) may be due at once; it is still kept minRefreshDelay, or
	// the streams of one identity would re-mint in turn without end, each
	// new credential's Changed waking the streams holding the previous one.
	at := refreshAt(chain[0], m.cfg.GraceRatio)
	if earliest := m.cfg.Clock.Now().Add(minRefreshDelay); at.Before(earliest) {
		at = earliest
	}
	return &Credential{Chain: chain, Key: key, RefreshAt: at}, nil
}

// refreshAt is NotBefore plus ratio of the certificate's lifetime.
func refreshAt(leaf *x509.Certificate, ratio float64) time.Time {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(time.Duration(math.Round(float64(life) * ratio)))
}
