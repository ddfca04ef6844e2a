package api

import (
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
)

// Trust is the answer of GET /v1/trust: the CA's published bundle.
type Trust struct {
	TrustDomain        string           `json:"trust_domain"`
	Sequence           uint64           `json:"sequence"`
	RefreshHintSeconds int64            `json:"refresh_hint_seconds"`
	Authorities        []TrustAuthority `json:"authorities"`
	// JWTAuthorities are the bundle's JWT authorities: the CA's signing
	// keys with their rotation state when the CA reports them.
	JWTAuthorities []TrustJWTAuthority `json:"jwt_authorities"`
	// OIDCIssuers are the OIDC issuers of JWT-SVIDs this server names,
	// ours (--jwt-issuer) first, with the keys their JWKS serves; left
	// out when there are none.
	OIDCIssuers []OIDCIssuer `json:"oidc_issuers,omitempty"`
}

// TrustAuthority is one of the CA's roots and its rotation state.
type TrustAuthority struct {
	ID          string     `json:"id"`
	State       string     `json:"state"`
	SHA256      string     `json:"sha256"`
	Subject     string     `json:"subject"`
	NotBefore   time.Time  `json:"not_before"`
	NotAfter    time.Time  `json:"not_after"`
	PreparedAt  time.Time  `json:"prepared_at"`
	ActivatedAt *time.Time `json:"activated_at,omitempty"`
	RetiredAt   *time.Time `json:"retired_at,omitempty"`
	RemoveAfter *time.Time `json:"remove_after,omitempty"`
	// TaintedAt and RevokedAt as Authority's.
	TaintedAt *time.Time `json:"tainted_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// TrustJWTAuthority is one JWT authority of the CA's published bundle:
// when the CA reports its keys, one of the CA's signing keys and its rotation state.
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
	JWTKey
	// TaintedAt and RevokedAt as Authority's.
	TaintedAt *time.Time `json:"tainted_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// NewTrust is GET /v1/trust: the CA's bundle b of td, its roots with
// their rotation state, and jwt, the bundle's JWT authorities as the
// snapshot describes them (the CA's own keys first, with their records).
func NewTrust(td spiffeid.TrustDomain, b *spiffebundle.Bundle, roots []ca.RootInfo, jwt []Authority) Trust {
	seq, _ := b.SequenceNumber()
	hint, _ := b.RefreshHint()
	doc := Trust{TrustDomain: td.Name(), Sequence: seq, RefreshHintSeconds: int64(hint / time.Second),
		Authorities: []TrustAuthority{}, JWTAuthorities: []TrustJWTAuthority{}}
	for _, r := range roots {
		doc.Authorities = append(doc.Authorities, TrustAuthority{
			ID: r.ID, State: string(r.State), SHA256: r.CertSHA256, Subject: r.Cert.Subject.String(),
			NotBefore: r.Cert.NotBefore.UTC(), NotAfter: r.Cert.NotAfter.UTC(), PreparedAt: r.PreparedAt.UTC(),
			ActivatedAt: optTime(r.ActivatedAt), RetiredAt: optTime(r.RetiredAt), RemoveAfter: optTime(r.RemoveAfter),
			TaintedAt: optTime(r.TaintedAt), RevokedAt: optTime(r.RevokedAt),
		})
	}
	for _, a := range jwt {
		t := TrustJWTAuthority{
			KID: a.KeyID, State: a.State, Algorithm: a.Algorithm, KeyType: a.PublicKeyAlgorithm,
			Curve: a.Curve, KeyBits: a.KeyBits, Thumbprint: a.Thumbprint, SHA256: a.SHA256,
			TaintedAt: a.TaintedAt, RevokedAt: a.RevokedAt,
		}
		if a.JWTKey != nil {
			t.JWTKey = *a.JWTKey
		}
		doc.JWTAuthorities = append(doc.JWTAuthorities, t)
	}
	return doc
}
