package ca

import (
	"crypto/x509"
	"fmt"
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

// currentBundle is Authority.Bundle.
func (m *manager) currentBundle() *spiffebundle.Bundle {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.bundle
}

// RootInfo describes a root for status reports.
type RootInfo struct {
	castate.RootRecord
	Cert *x509.Certificate
}

// rootInfos is Authority.Roots.
func (m *manager) rootInfos() []RootInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]RootInfo, 0, len(m.roots))
	for _, r := range m.roots {
		out = append(out, RootInfo{RootRecord: r.RootRecord, Cert: r.Cert})
	}
	return out
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
		states = append(states, r.ID+"="+string(r.State))
	}
	for _, k := range m.jwtKeys {
		states = append(states, jwtServedKey(k.KID)+"="+string(k.State))
	}
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

// readinessGauge is 1 while Ready reports a problem, so alerts need not
// scrape /readyz.
func (a *Authority) readinessGauge() float64 {
	if a.Ready() != nil {
		return 1
	}
	return 0
}
