package admin

import (
	"maps"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// JWTKeys lists the CA's JWT signing keys with their state
// (ca.Authority).
type JWTKeys interface {
	JWTKeys() []ca.JWTKeyInfo
}

// TrustJWTAuthority is one JWT authority of the CA's published bundle:
// with Config.JWT, one of the CA's signing keys and its rotation state.
type TrustJWTAuthority struct {
	KID   string `json:"kid"`
	State string `json:"state,omitempty"`
	// Algorithm is the one the CA signs with; for a key without a record,
	// the one its type implies.
	Algorithm string `json:"algorithm,omitempty"`
	// KeyType is RSA, ECDSA or Ed25519; Curve and KeyBits its size.
	KeyType    string `json:"key_type"`
	Curve      string `json:"curve,omitempty"`
	KeyBits    int    `json:"key_bits,omitempty"`
	Thumbprint string `json:"thumbprint,omitempty"` // RFC 7638, SHA-256, base64url
	SHA256     string `json:"sha256"`               // of the SubjectPublicKeyInfo DER
	// The key's times, for the CA's own keys (inlined in JSON).
	api.JWTKey
}

// trustJWTAuthorities are the CA's JWT keys with their state, then any
// other JWT authority of its bundle b.
func (h *Handler) trustJWTAuthorities(b *spiffebundle.Bundle) []TrustJWTAuthority {
	out := []TrustJWTAuthority{}
	for _, a := range h.localJWTAuthorities(b) {
		t := TrustJWTAuthority{
			KID: a.KeyID, State: a.State, Algorithm: a.Algorithm, KeyType: a.PublicKeyAlgorithm,
			Curve: a.Curve, KeyBits: a.KeyBits, Thumbprint: a.Thumbprint, SHA256: a.SHA256,
		}
		if a.JWTKey != nil {
			t.JWTKey = *a.JWTKey
		}
		out = append(out, t)
	}
	return out
}

// localJWTAuthorities are the CA's JWT signing keys with their state, in
// the CA's order, then b's other JWT authorities sorted by key ID.
func (h *Handler) localJWTAuthorities(b *spiffebundle.Bundle) []api.Authority {
	out := []api.Authority{}
	seen := map[string]bool{}
	if h.cfg.JWT != nil {
		for _, k := range h.cfg.JWT.JWTKeys() {
			a := jwtKeyAuthority(k)
			a.KeyStorage = h.keyStorage(k.KeyRef)
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

// jwtKeyAuthority describes one of the CA's JWT signing keys.
func jwtKeyAuthority(k ca.JWTKeyInfo) api.Authority {
	a := api.KeyAuthority(api.KindJWT, k.KID, k.Public)
	a.State = string(k.State)
	if k.Algorithm != "" {
		a.Algorithm = k.Algorithm
	}
	a.JWTKey = &api.JWTKey{
		CreatedAt: optTime(k.CreatedAt), NotAfter: optTime(k.NotAfter), PreparedAt: optTime(k.PreparedAt),
		ActivatedAt: optTime(k.ActivatedAt), RetiredAt: optTime(k.RetiredAt), RemoveAfter: optTime(k.RemoveAfter),
	}
	for _, t := range []time.Time{k.RetiredAt, k.ActivatedAt, k.PreparedAt, k.CreatedAt} {
		if !t.IsZero() {
			a.Since = optTime(t)
			break
		}
	}
	return a
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
