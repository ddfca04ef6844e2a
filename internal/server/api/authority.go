package api

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"maps"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/trustbridge/trustbridge/ca"
)

// Authority kinds.
const (
	KindX509 = "x509"
	KindJWT  = "jwt"
	KindWIT  = "wit"
)

// Authority is one trusted key: an X.509 root, or a JWT/WIT key.
type Authority struct {
	Kind   string `json:"kind"`
	SHA256 string `json:"sha256"` // of the certificate DER; of the SPKI for keys
	KeyID  string `json:"key_id,omitempty"`
	// State is the local CA's state of its own roots and JWT signing keys
	// (prepared, active, retired); empty for other trust domains.
	State string `json:"state,omitempty"`
	// Since is when the authority entered its current state, where known.
	Since *time.Time `json:"since,omitempty"`
	// ID is the local CA's name of its own root or intermediate (hex
	// serial), as `trustbridge ca authority` takes it; empty for every
	// other authority (a JWT key goes by KeyID).
	ID string `json:"id,omitempty"`
	// TaintedAt is when an operator tainted one of the local CA's own
	// authorities (`trustbridge ca authority taint`): clients re-issue
	// what it signed, and it is to be revoked once they did. RevokedAt is
	// when it was revoked (State "revoked"): it is no longer published,
	// and is listed until it expires.
	TaintedAt *time.Time `json:"tainted_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// Upstream names the upstream authority that signed a local
	// intermediate (upstream mode): the entry is then the CA's signing
	// intermediate, not a published root.
	Upstream string `json:"upstream,omitempty"`
	// KeyStorage is where the local CA keeps the private key of its own
	// root or JWT key: "state" (the CA state backend) or the key manager
	// (e.g. `pkcs11 token "tb" (libsofthsm2.so)`); empty for every other
	// authority, and from servers that predate key managers.
	KeyStorage string `json:"key_storage,omitempty"`

	// X.509 only.
	Subject            string     `json:"subject,omitempty"`
	NotBefore          *time.Time `json:"not_before,omitempty"`
	NotAfter           *time.Time `json:"not_after,omitempty"`
	IsCA               bool       `json:"is_ca,omitempty"`
	SignatureAlgorithm string     `json:"signature_algorithm,omitempty"`
	PublicKeyAlgorithm string     `json:"public_key_algorithm,omitempty"`
	KeyBits            int        `json:"key_bits,omitempty"`
	// Certificate is the DER (base64 in JSON), so audits can re-check.
	Certificate []byte `json:"certificate,omitempty"`

	// JWT and WIT keys only (PublicKeyAlgorithm and KeyBits above are set
	// for them too).
	Curve string `json:"curve,omitempty"` // ECDSA: P-256, P-384, P-521
	// Algorithm is the JWS algorithm the key implies (ES256 for P-256,
	// RS256/PS256 family for RSA, EdDSA); for our own keys, the one the
	// CA signs with.
	Algorithm string `json:"algorithm,omitempty"`
	// Thumbprint is the RFC 7638 JWK thumbprint (SHA-256, base64url), the
	// key's name in most JOSE tooling.
	Thumbprint string `json:"thumbprint,omitempty"`
	// PublicKey is the SubjectPublicKeyInfo DER (base64 in JSON), so
	// audits can re-check the key itself.
	PublicKey []byte `json:"public_key,omitempty"`
	// JWTKey is the local CA's lifecycle record of its own JWT signing
	// key; nil for every other key.
	JWTKey *JWTKey `json:"jwt_key,omitempty"`
}

// X509Authority describes a certificate authority.
func X509Authority(c *x509.Certificate) Authority {
	sum := sha256.Sum256(c.Raw)
	nb, na := c.NotBefore.UTC(), c.NotAfter.UTC()
	return Authority{
		Kind: KindX509, SHA256: hex.EncodeToString(sum[:]),
		Subject: c.Subject.String(), NotBefore: &nb, NotAfter: &na,
		IsCA:               c.BasicConstraintsValid && c.IsCA,
		SignatureAlgorithm: c.SignatureAlgorithm.String(),
		PublicKeyAlgorithm: c.PublicKeyAlgorithm.String(),
		KeyBits:            KeyBits(c.PublicKey),
		Certificate:        c.Raw,
	}
}

// KeyBits is the size of a public key: the modulus for RSA, the curve
// for ECDSA, 256 for Ed25519, 0 when unknown.
func KeyBits(pub any) int {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return k.N.BitLen()
	case *ecdsa.PublicKey:
		return k.Curve.Params().BitSize
	case ed25519.PublicKey:
		return 256
	}
	return 0
}

// RootAuthority is one of the local CA's roots (in upstream mode, its
// signing intermediate) with its rotation state. keyManager names the
// CA's key manager (--key-manager), where a root with a KeyRef keeps its
// key; "" for none.
func RootAuthority(r ca.RootInfo, keyManager string) Authority {
	a := X509Authority(r.Cert)
	a.State = string(r.State)
	if r.Upstream != nil {
		a.Upstream = r.Upstream.Name
	}
	a.KeyStorage = keyStorage(r.KeyRef, keyManager)
	a.ID, a.TaintedAt, a.RevokedAt = r.ID, optTime(r.TaintedAt), optTime(r.RevokedAt)
	a.Since = firstSet(r.RevokedAt, r.RetiredAt, r.ActivatedAt, r.PreparedAt)
	return a
}

// JWTKeyAuthority is one of the local CA's JWT signing keys with its
// rotation state and lifecycle (keyManager as for RootAuthority).
func JWTKeyAuthority(k ca.JWTKeyInfo, keyManager string) Authority {
	a := KeyAuthority(KindJWT, k.KID, k.Public)
	a.State = string(k.State)
	if k.Algorithm != "" {
		a.Algorithm = k.Algorithm
	}
	a.KeyStorage = keyStorage(k.KeyRef, keyManager)
	a.JWTKey = &JWTKey{
		CreatedAt: optTime(k.CreatedAt), NotAfter: optTime(k.NotAfter), PreparedAt: optTime(k.PreparedAt),
		ActivatedAt: optTime(k.ActivatedAt), RetiredAt: optTime(k.RetiredAt), RemoveAfter: optTime(k.RemoveAfter),
	}
	a.TaintedAt, a.RevokedAt = optTime(k.TaintedAt), optTime(k.RevokedAt)
	a.Since = firstSet(k.RevokedAt, k.RetiredAt, k.ActivatedAt, k.PreparedAt, k.CreatedAt)
	return a
}

// BundleAuthorities describes b's authorities (X.509, then JWT and WIT
// keys by key ID), skipping those whose SHA256 is in skip.
func BundleAuthorities(b *spiffebundle.Bundle, skip map[string]bool) []Authority {
	out := []Authority{}
	if b == nil {
		return out
	}
	for _, c := range b.X509Authorities() {
		if a := X509Authority(c); !skip[a.SHA256] {
			out = append(out, a)
		}
	}
	for _, set := range []struct {
		kind string
		keys map[string]crypto.PublicKey
	}{{KindJWT, b.JWTAuthorities()}, {KindWIT, b.WITAuthorities()}} {
		for _, kid := range slices.Sorted(maps.Keys(set.keys)) {
			if a := KeyAuthority(set.kind, kid, set.keys[kid]); !skip[a.SHA256] {
				out = append(out, a)
			}
		}
	}
	return out
}

// keyStorage is the key_storage of one of the CA's own keys: the key
// manager when the key has a reference there, else "state".
func keyStorage(keyRef, keyManager string) string {
	if keyRef == "" {
		return "state"
	}
	return cmp.Or(keyManager, "key manager")
}

// firstSet is the first of ts that is set, in UTC; nil if none is.
func firstSet(ts ...time.Time) *time.Time {
	for _, t := range ts {
		if !t.IsZero() {
			return optTime(t)
		}
	}
	return nil
}
