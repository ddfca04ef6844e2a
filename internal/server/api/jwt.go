package api

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// JWTKey is where one of the local CA's JWT signing keys is in its life.
// Its validity is kept apart from the Authority's NotBefore/NotAfter,
// which are an X.509 certificate's: a JWT key is short-lived by design
// and is judged by whether its successor is ready, not by the 30-day
// expiry thresholds of roots.
type JWTKey struct {
	CreatedAt   *time.Time `json:"created_at,omitempty"`
	NotAfter    *time.Time `json:"not_after,omitempty"`
	PreparedAt  *time.Time `json:"prepared_at,omitempty"`
	ActivatedAt *time.Time `json:"activated_at,omitempty"`
	RetiredAt   *time.Time `json:"retired_at,omitempty"`
	RemoveAfter *time.Time `json:"remove_after,omitempty"`
}

// KeyAuthority describes a JWT or WIT authority (kind KindJWT or
// KindWIT) by its key ID and public key.
func KeyAuthority(kind, kid string, pub crypto.PublicKey) Authority {
	a := Authority{
		Kind: kind, KeyID: kid, SHA256: SPKISHA256(pub),
		PublicKeyAlgorithm: PublicKeyAlgorithm(pub), KeyBits: KeyBits(pub),
		Algorithm: ImpliedAlgorithm(pub),
	}
	if k, ok := pub.(*ecdsa.PublicKey); ok {
		a.Curve = k.Curve.Params().Name
	}
	if der, err := x509.MarshalPKIXPublicKey(pub); err == nil {
		a.PublicKey = der
	}
	if tp, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256); err == nil {
		a.Thumbprint = base64.RawURLEncoding.EncodeToString(tp)
	}
	return a
}

// SPKISHA256 fingerprints a public key as the audit log and federation
// status do: SHA-256 hex of its SubjectPublicKeyInfo DER, or a marker
// naming its type when Go cannot marshal it.
func SPKISHA256(pub crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Sprintf("unmarshalable-%T", pub)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// PublicKeyAlgorithm names a key's type as x509.PublicKeyAlgorithm does
// (RSA, ECDSA, Ed25519), or by its Go type when it is none of those.
func PublicKeyAlgorithm(pub crypto.PublicKey) string {
	switch pub.(type) {
	case *rsa.PublicKey:
		return x509.RSA.String()
	case *ecdsa.PublicKey:
		return x509.ECDSA.String()
	case ed25519.PublicKey:
		return x509.Ed25519.String()
	}
	return fmt.Sprintf("%T", pub)
}

// ImpliedAlgorithm is the JWS algorithm a verifier uses with pub: an EC
// key fixes it by its curve (RFC 7518 §3.4); an RSA key verifies RS* and
// PS* alike, the hash being the signer's choice; "" for other keys.
func ImpliedAlgorithm(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve.Params().Name {
		case "P-256":
			return string(jose.ES256)
		case "P-384":
			return string(jose.ES384)
		case "P-521":
			return string(jose.ES512)
		}
	case *rsa.PublicKey:
		return "RS256/PS256"
	case ed25519.PublicKey:
		return string(jose.EdDSA)
	}
	return ""
}
