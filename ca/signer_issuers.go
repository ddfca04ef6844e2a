package ca

import (
	"crypto/x509"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// issuedHere is Authority.IssuedHere.
func (s *signer) issuedHere(issuer *x509.Certificate) bool {
	if issuer == nil {
		return false
	}
	snap := s.board.load()
	for _, c := range snap.issuers {
		if c.Equal(issuer) {
			return true
		}
	}
	if len(snap.pluginSigners) == 0 {
		return false
	}
	now := s.cfg.Clock.Now()
	for _, p := range snap.pluginSigners {
		if now.Before(p.until) && p.cert.Equal(issuer) {
			return true
		}
	}
	return false
}

// issuersLocked are the signing certificates IssuedHere accepts, but for
// earlier plug-in ones: in plug-in mode the directory's current CA
// certificate, never a root of root-cert.pem; otherwise the roots (or
// intermediates) whose key is ours.
func (m *manager) issuersLocked() []*x509.Certificate {
	var out []*x509.Certificate
	if m.cfg.Plugin != nil {
		if m.plugin != nil && m.plugin.Cert != nil {
			out = append(out, m.plugin.Cert)
		}
		return out
	}
	for _, r := range m.roots {
		if ownKey(r.State) {
			out = append(out, r.Cert)
		}
	}
	return out
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

// pluginSigner is a plug-in CA certificate this process signed with
// before the directory changed, and until when leaves it signed may be
// valid.
type pluginSigner struct {
	cert  *x509.Certificate
	until time.Time
}
