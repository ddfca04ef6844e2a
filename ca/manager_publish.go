package ca

import (
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// subscribe is Authority.Subscribe.
func (m *manager) subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	if m.hasStateLocked() {
		ch <- struct{}{}
	}
	m.subs = append(m.subs, ch)
	m.mu.Unlock()
	return ch
}

// RootInfo describes a root for status reports.
type RootInfo struct {
	castate.RootRecord
	Cert *x509.Certificate
	// RevokedAt is when an operator revoked the root (State is then
	// castate.StateRevoked): it is no longer published.
	RevokedAt time.Time
}

// rootInfos is Authority.Roots: the roots in use, then those revoked
// (State castate.StateRevoked) that have not expired yet.
func (m *manager) rootInfos() []RootInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]RootInfo, 0, len(m.roots))
	for _, r := range m.roots {
		out = append(out, RootInfo{RootRecord: r.RootRecord, Cert: r.Cert})
	}
	for _, rev := range m.journal.Revoked {
		if rev.Root == nil {
			continue
		}
		cert, err := x509.ParseCertificate(rev.DER) // checked by DecodeJournal
		if err != nil {
			continue
		}
		out = append(out, RootInfo{RootRecord: *rev.Root, Cert: cert, RevokedAt: rev.RevokedAt})
	}
	return out
}

func taintMark(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return "+tainted"
}

// sequence is Authority.Sequence.
func (m *manager) sequence() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.journal.Sequence
}

// hasStateLocked reports whether the CA has state to publish: not a
// follower before the leader wrote it.
func (m *manager) hasStateLocked() bool {
	return len(m.roots) > 0 || m.cfg.Plugin != nil
}

func (m *manager) publishLocked() {
	if !m.hasStateLocked() {
		return
	}
	now := m.cfg.Clock.Now()
	current := make(map[string]bool, len(m.roots))
	certs := make([]*x509.Certificate, 0, len(m.roots))
	seen := map[string]bool{}
	for _, r := range m.roots {
		// Upstream roots several intermediates share are published once;
		// an intermediate itself never is.
		for _, c := range r.Published() {
			if fp := fingerprint(c); !seen[fp] {
				seen[fp] = true
				certs = append(certs, c)
			}
		}
		current[r.ID] = true
		if _, ok := m.served[r.ID]; !ok {
			m.served[r.ID] = now
		}
	}
	b := spiffebundle.FromX509Authorities(m.cfg.TrustDomain, certs)
	m.publishJWTLocked(b, now, current)
	for id := range m.served {
		if !current[id] {
			delete(m.served, id)
		}
	}
	b.SetSequenceNumber(m.journal.Sequence)
	b.SetRefreshHint(m.cfg.RefreshHint)
	changed := m.bundle == nil || !m.bundle.Equal(b)
	m.bundle = b
	m.metrics.observe(m.roots, m.jwtKeys, m.journal.Sequence)
	states := make([]string, 0, len(m.roots)+len(m.jwtKeys))
	for _, r := range m.roots {
		states = append(states, r.ID+"="+string(r.State)+taintMark(r.TaintedAt))
	}
	for _, k := range m.jwtKeys {
		states = append(states, jwtServedKey(k.KID)+"="+string(k.State)+taintMark(k.TaintedAt))
	}
	// A taint or a revocation changes no published key but what clients
	// must do: subscribers hear of it.
	states = append(states, fmt.Sprintf("revoked=%d", len(m.journal.Revoked)))
	stateKey := strings.Join(states, ",")
	stateChanged := stateKey != m.published
	m.published = stateKey
	if changed || stateChanged {
		signal(m.subs)
	}
}

// signal wakes each channel without blocking (they are coalescing).
func signal(chs []chan struct{}) {
	for _, ch := range chs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// ready is Authority.Ready.
func (m *manager) ready() error {
	if m.cfg.Plugin != nil {
		if err := m.cfg.Plugin.lastError(); err != nil {
			return fmt.Errorf("%w (still signing with the last good material)", err)
		}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if err := m.upstreamWaitingLocked(m.cfg.Clock.Now()); err != nil {
		return err
	}
	if m.lastErr != nil {
		return fmt.Errorf("last CA check failed: %w", m.lastErr)
	}
	mat, err := m.signingMaterialLocked()
	if err != nil {
		return err
	}
	if now := m.cfg.Clock.Now(); now.After(mat.Cert.NotAfter) {
		return fmt.Errorf("ca: active root %s expired at %s", fingerprint(mat.Cert)[:16], mat.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// policyLocked is the leaf policy. Requests are refused only
// over the configured maximum; the journal's recorded maximum, when
// shorter, only clamps a leaf's lifetime. The leader removes a retired root
// once the recorded maximum has passed, so a replica configured with a
// higher maximum than the leader's must not sign leaves that outlive their
// root in the bundle; but refusing would fail a rollout that raises the
// maximum, whose new pods follow the old leader until they lead and raise
// the record themselves.
func (m *manager) policyLocked() Policy {
	return Policy{
		TrustDomain: m.cfg.TrustDomain, DefaultTTL: m.cfg.WorkloadTTL, MaxTTL: m.cfg.MaxWorkloadTTL,
		ClampTTL: recordedTTL(m.journal.MaxWorkloadTTLSeconds),
	}
}

// recordedTTL is a journal's recorded maximum as a clamp: zero (none) when
// it is not positive, and no shorter than it is when it would overflow a
// Duration, so a damaged journal never turns into a negative policy.
func recordedTTL(seconds int64) time.Duration {
	switch {
	case seconds <= 0:
		return 0
	case seconds > math.MaxInt64/int64(time.Second):
		return math.MaxInt64
	default:
		return time.Duration(seconds) * time.Second
	}
}

// materialLocked is what the state signs with; its Cert is nil when
// nothing is active (or no plug-in material published yet).
func (m *manager) materialLocked() SigningMaterial {
	if m.cfg.Plugin != nil {
		p := m.plugin
		if p == nil {
			return SigningMaterial{}
		}
		return SigningMaterial{Cert: p.Cert, Key: p.Key, Intermediates: p.Intermediates, Roots: p.Roots}
	}
	return RootsMaterial(m.roots)
}

// signingMaterialLocked is materialLocked, or why there is nothing to
// sign with.
func (m *manager) signingMaterialLocked() (SigningMaterial, error) {
	mat := m.materialLocked()
	if mat.Cert == nil {
		return mat, m.noMaterialLocked()
	}
	return mat, nil
}

// noMaterial says why there is nothing to sign with, for a signer that
// found no signing certificate in the snapshot it read. The reason may
// lie outside the published state (leadership, the upstream's last
// answer), so it is read now.
func (m *manager) noMaterial() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.noMaterialLocked()
}

func (m *manager) noMaterialLocked() error {
	if m.cfg.Plugin != nil {
		return errors.New("ca: no plug-in CA material published")
	}
	if len(m.roots) == 0 && !m.leading() {
		return fmt.Errorf("ca: %w: no CA state in %s yet; the leader creates it", ErrInvalidSigningMaterial, m.backend.Describe())
	}
	if m.cfg.Upstream != nil && m.up.lastErr != nil {
		// At a first start the upstream's refusal is the reason: a
		// serving certificate that cannot be made says why.
		return fmt.Errorf("ca: %w: no intermediate yet; the upstream's last answer failed: %v", ErrInvalidSigningMaterial, m.up.lastErr)
	}
	return fmt.Errorf("ca: %w: no active root", ErrInvalidSigningMaterial)
}

// RootsMaterial is the signing material of loaded roots (Store.Load): the
// active root or upstream intermediate signs (Cert is nil when none is
// active), with the upstream's intermediates above it, and Roots are every
// published root: the self-signed roots, or in upstream mode the upstream
// roots of every intermediate kept, never an intermediate itself.
func RootsMaterial(roots []*castate.Root) SigningMaterial {
	var m SigningMaterial
	for _, r := range roots {
		for _, c := range r.Published() {
			// A handful of roots: comparing bytes beats hashing them on
			// every signing.
			if !slices.ContainsFunc(m.Roots, c.Equal) {
				m.Roots = append(m.Roots, c)
			}
		}
		if r.State == castate.StateActive {
			m.Cert, m.Key, m.Intermediates = r.Cert, r.Key, r.UpstreamChain
		}
	}
	return m
}

// lockChange takes mu for a change to what signing reads, and begins the
// change on the board: signers that read their time from now on wait for
// unlockChange. Reading the backend happens before, under stateMu alone,
// so that a slow or unreachable API server never stalls signing.
func (m *manager) lockChange() {
	m.mu.Lock()
	m.board.begin()
}

// unlockChange publishes the state as the change left it (unchanged when
// it failed and went back) and releases mu.
func (m *manager) unlockChange() {
	m.board.end(m.snapshotLocked())
	m.mu.Unlock()
}

// snapshotLocked is what signing needs of the state as it is now, copied
// out of it: the manager changes roots and keys in place.
func (m *manager) snapshotLocked() *signingSnapshot {
	s := &signingSnapshot{
		material: m.materialLocked(), policy: m.policyLocked(), bundle: m.bundle,
		issuers: m.issuersLocked(), pluginSigners: slices.Clone(m.pluginSigners),
		maxJWTSVIDTTL: m.maxJWTSVIDTTLLocked(),
	}
	if k := m.activeJWTKeyLocked(); k != nil {
		s.jwtKey = &jwtSigningKey{kid: k.KID, key: k.Key, notAfter: k.NotAfter}
	} else {
		s.noJWTKey = m.noJWTKeyLocked()
	}
	return s
}
