package ca

import (
	"crypto/x509"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
)

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
func (a *Authority) IssuedHere(issuer *x509.Certificate) bool {
	if issuer == nil {
		return false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.cfg.Plugin != nil {
		return a.pluginIssuedLocked(issuer)
	}
	for _, r := range a.roots {
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
func (a *Authority) pluginIssuedLocked(issuer *x509.Certificate) bool {
	if a.plugin != nil && a.plugin.Cert.Equal(issuer) {
		return true
	}
	now := a.cfg.Clock.Now()
	for _, s := range a.pluginSigners {
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
func (a *Authority) retirePluginSignerLocked(now time.Time, next *PluginMaterial) {
	kept := a.pluginSigners[:0]
	for _, s := range a.pluginSigners {
		if now.Before(s.until) {
			kept = append(kept, s)
		}
	}
	a.pluginSigners = kept
	prev := a.plugin
	if prev == nil || prev.Cert == nil || (next != nil && next.Cert.Equal(prev.Cert)) {
		return
	}
	// Every leaf was clamped to the signing certificate's own expiry and
	// to MaxWorkloadTTL, signed under mu before now.
	until := minTime(prev.Cert.NotAfter, now.Add(retireMargin+a.timelineLocked().MaxWorkloadTTL))
	a.pluginSigners = append(a.pluginSigners, pluginSigner{cert: prev.Cert, until: until})
}
