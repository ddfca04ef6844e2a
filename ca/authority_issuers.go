package ca

import (
	"crypto/x509"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// issuedHere is Authority.IssuedHere.
func (m *manager) issuedHere(issuer *x509.Certificate) bool {
	if issuer == nil {
		return false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.cfg.Plugin != nil {
		return m.pluginIssuedLocked(issuer)
	}
	for _, r := range m.roots {
		if ownKey(r.State) && r.Cert.Equal(issuer) {
			return true
		}
	}
	return false
}

// ownKey says whether a root in state s signs with a key of ours: every
// state but a plug-in directory's external roots.
func ownKey(s castate.RootState) bool {
	switch s {
	case castate.StatePrepared, castate.StateActive, castate.StateRetired:
		return true
	}
	return false
}

// pluginIssuedLocked is IssuedHere in plug-in mode.
func (m *manager) pluginIssuedLocked(issuer *x509.Certificate) bool {
	if m.plugin != nil && m.plugin.Cert.Equal(issuer) {
		return true
	}
	now := m.cfg.Clock.Now()
	for _, s := range m.pluginSigners {
		if now.Before(s.until) && s.cert.Equal(issuer) {
			return true
		}
	}
	return false
}

// pluginSigner is a plug-in CA certificate this process signed with
// before the directory changed, and until when leaves it signed may be
// valid.
type pluginSigner struct {
	cert  *x509.Certificate
	until time.Time
}

// retirePluginSignerLocked remembers the plug-in CA certificate in use
// when next replaces it, and forgets those whose leaves have all expired.
func (m *manager) retirePluginSignerLocked(now time.Time, next *PluginMaterial) {
	kept := m.pluginSigners[:0]
	for _, s := range m.pluginSigners {
		if now.Before(s.until) {
			kept = append(kept, s)
		}
	}
	m.pluginSigners = kept
	prev := m.plugin
	if prev == nil || prev.Cert == nil || (next != nil && next.Cert.Equal(prev.Cert)) {
		return
	}
	// Every leaf was clamped to the signing certificate's own expiry and
	// to MaxWorkloadTTL, signed under mu before now.
	until := minTime(prev.Cert.NotAfter, now.Add(retireMargin+m.timelineLocked().MaxWorkloadTTL))
	m.pluginSigners = append(m.pluginSigners, pluginSigner{cert: prev.Cert, until: until})
}
