package ca

import (
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca/castate"
)

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
func (a *Authority) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	a.mu.Lock()
	if a.hasStateLocked() {
		ch <- struct{}{}
	}
	a.subs = append(a.subs, ch)
	a.mu.Unlock()
	return ch
}

// Bundle returns the published bundle: every prepared, active and retired
// root and JWT key (a JWT authority under its kid), the sequence number
// and the refresh hint. It is shared and must
// not be modified; Clone it first.
func (a *Authority) Bundle() *spiffebundle.Bundle {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.bundle
}

// RootInfo describes a root for status reports.
type RootInfo struct {
	castate.RootRecord
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

// hasStateLocked reports whether the CA has state to publish: not a
// follower before the leader wrote it.
func (a *Authority) hasStateLocked() bool {
	return len(a.roots) > 0 || a.cfg.Plugin != nil
}

func (a *Authority) publishLocked() {
	if !a.hasStateLocked() {
		return
	}
	now := a.cfg.Clock.Now()
	current := make(map[string]bool, len(a.roots))
	certs := make([]*x509.Certificate, 0, len(a.roots))
	seen := map[string]bool{}
	for _, r := range a.roots {
		// Upstream roots several intermediates share are published once;
		// an intermediate itself never is.
		for _, c := range r.Published() {
			if fp := fingerprint(c); !seen[fp] {
				seen[fp] = true
				certs = append(certs, c)
			}
		}
		current[r.ID] = true
		if _, ok := a.served[r.ID]; !ok {
			a.served[r.ID] = now
		}
	}
	b := spiffebundle.FromX509Authorities(a.cfg.TrustDomain, certs)
	a.publishJWTLocked(b, now, current)
	for id := range a.served {
		if !current[id] {
			delete(a.served, id)
		}
	}
	b.SetSequenceNumber(a.journal.Sequence)
	b.SetRefreshHint(a.cfg.RefreshHint)
	changed := a.bundle == nil || !a.bundle.Equal(b)
	a.bundle = b
	a.metrics.observe(a.roots, a.jwtKeys, a.journal.Sequence)
	states := make([]string, 0, len(a.roots)+len(a.jwtKeys))
	for _, r := range a.roots {
		states = append(states, r.ID+"="+string(r.State))
	}
	for _, k := range a.jwtKeys {
		states = append(states, jwtServedKey(k.KID)+"="+string(k.State))
	}
	stateKey := strings.Join(states, ",")
	stateChanged := stateKey != a.published
	a.published = stateKey
	if changed || stateChanged {
		signal(a.subs)
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

// Ready reports why the CA cannot sign, or nil. In plug-in mode a bad
// change to the directory makes it not ready, though it keeps signing
// with the last good material: operators must see the error.
func (a *Authority) Ready() error {
	if a.cfg.Plugin != nil {
		if err := a.cfg.Plugin.lastError(); err != nil {
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
