package admin

import (
	"maps"
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// JWTKeys lists the CA's JWT signing keys with their state
// (ca.Authority).
type JWTKeys interface {
	JWTKeys() []ca.JWTKeyInfo
}

// localJWTAuthorities are the CA's JWT signing keys with their state, in
// the CA's order, then b's other JWT authorities sorted by key ID.
func (h *Handler) localJWTAuthorities(b *spiffebundle.Bundle) []api.Authority {
	out := []api.Authority{}
	seen := map[string]bool{}
	if h.cfg.JWT != nil {
		for _, k := range h.cfg.JWT.JWTKeys() {
			a := api.JWTKeyAuthority(k, h.cfg.KeyManager)
			out = append(out, a)
			seen[k.KID] = true
		}
	}
	if b == nil {
		return out
	}
	keys := b.JWTAuthorities()
	for _, kid := range slices.Sorted(maps.Keys(keys)) {
		if !seen[kid] {
			out = append(out, api.KeyAuthority(api.KindJWT, kid, keys[kid]))
		}
	}
	return out
}

// jwtIssuer reports whether the CA reported JWT signing keys among the
// local authorities: a CA that reports none (a plug-in CA directory
// without them, a build before JWT-SVIDs) does not mint JWT-SVIDs, so
// having no active key is no finding there.
func jwtIssuer(auths []api.Authority) bool {
	for _, a := range auths {
		if a.JWTKey != nil {
			return true
		}
	}
	return false
}
