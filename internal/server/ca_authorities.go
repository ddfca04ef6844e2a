package server

import (
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// caBundleSource is the CA as the bundle endpoint's local source: its bundle
// and, as a bundleserver.RevocationSource, the authorities an operator
// revoked (`ca authority revoke`), which the served document names so
// that trustbridge peers refuse a bundle that brings one back.
type caBundleSource struct{ a *ca.Authority }

func (s caBundleSource) Bundle() *spiffebundle.Bundle { return s.a.Bundle() }

func (s caBundleSource) Revocations() []bundledoc.Revocation { return caRevocations(s.a) }

// caRevocations are the entries of a's revoked roots, intermediates and
// JWT keys; the CA keeps them until they expire.
func caRevocations(a *ca.Authority) []bundledoc.Revocation {
	var out []bundledoc.Revocation
	for _, r := range a.Roots() {
		if r.State == castate.StateRevoked {
			out = append(out, bundledoc.RevokeX509(r.Cert))
		}
	}
	for _, k := range a.JWTKeys() {
		if k.State == castate.StateRevoked {
			out = append(out, bundledoc.Revocation{Use: bundledoc.UseJWTSVID, KID: k.KID, NotAfter: k.NotAfter})
		}
	}
	return out
}
