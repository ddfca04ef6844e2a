// Package api is the operator's picture of what one trustbridge
// server trusts at one instant: every trust domain, by which authorities,
// since when and from where, plus findings about it. The admin listener
// serves it as JSON at GET /v1/snapshot; `trustbridge audit` analyses that
// JSON and the /ui page renders it. It holds plain data only, so the
// packages that build, check and draw it need not import each other.
package api

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"time"
)

// Snapshot is what a server trusts at Time.
type Snapshot struct {
	Time        time.Time `json:"time"`
	TrustDomain string    `json:"trust_domain"` // the server's own trust domain
	// Actor names this replica (the leader-election identity, or the
	// host name without Kubernetes); Leader is whether it leads.
	Actor  string `json:"actor"`
	Leader bool   `json:"leader"`
	// TrustDomains holds the local trust domain first, then every other
	// trusted or federated one sorted by name.
	TrustDomains []TrustDomain `json:"trust_domains"`
	// TrustPolicy is the per-workload trust policy in force; nil from a
	// server that predates trust policies.
	TrustPolicy *TrustPolicy `json:"trust_policy,omitempty"`
	// RequireHSM is the server's --require-hsm: its own roots and JWT
	// keys must live in a key manager (KeyStorage other than "state").
	RequireHSM bool `json:"require_hsm,omitempty"`
	// CA is the local CA's issuance settings and, in upstream mode, its
	// upstream's health; nil from a server that predates them.
	CA *CAStatus `json:"ca,omitempty"`
}

// CAStatus is what audits need of the local CA beyond its authorities.
type CAStatus struct {
	// WorkloadTTLSeconds and MaxWorkloadTTLSeconds are the default and the
	// longest lifetime of the workload certificates it signs.
	WorkloadTTLSeconds    int64 `json:"workload_ttl_seconds"`
	MaxWorkloadTTLSeconds int64 `json:"max_workload_ttl_seconds"`
	// Upstream is set in upstream mode (--upstream).
	Upstream *UpstreamStatus `json:"upstream,omitempty"`
}

// UpstreamStatus is the health of the upstream authority that signs the
// local CA's intermediate.
type UpstreamStatus struct {
	Name string `json:"name"`
	// LastSuccess is when it last signed an intermediate.
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// LastError and LastErrorAt describe the last failed request;
	// Failures counts the failures since the last success, the first of
	// which was at FailingSince.
	LastError    string     `json:"last_error,omitempty"`
	LastErrorAt  *time.Time `json:"last_error_at,omitempty"`
	Failures     int        `json:"failures,omitempty"`
	FailingSince *time.Time `json:"failing_since,omitempty"`
}

// TrustDomain is one trust domain and the authorities trusted for it.
type TrustDomain struct {
	Name  string `json:"name"`
	Local bool   `json:"local"`
	// Sources are the trust-store sources that contribute to it: "ca"
	// (our own CA), "federation:<td>" (a polled endpoint), "file:<path>".
	Sources []string `json:"sources"`
	// Federation is set for a trust domain this server polls.
	Federation *Federation `json:"federation,omitempty"`
	// Sequence is the spiffe_sequence of the bundle trusted now.
	Sequence    *uint64     `json:"sequence,omitempty"`
	Authorities []Authority `json:"authorities"`
	// TrustedBy says which local workloads may trust this trust domain
	// under the trust policy; nil for the local trust domain (every
	// workload trusts it) and from servers without trust policies.
	TrustedBy *TrustedBy `json:"trusted_by,omitempty"`
	// JWTIssuer is set on the local trust domain when our CA mints
	// JWT-SVIDs: its JWT authorities then carry their key state (JWTKey),
	// and having none active is a finding. Unset from servers that
	// predate JWT-SVIDs, which are not judged on it.
	JWTIssuer bool `json:"jwt_issuer,omitempty"`
}

// Federation is the polling state of a federated trust domain, as
// /v1/federation reports it.
type Federation struct {
	EndpointURL      string `json:"endpoint_url"`
	Profile          string `json:"profile"` // https_web or https_spiffe
	EndpointSPIFFEID string `json:"endpoint_spiffe_id,omitempty"`
	// Origin says where the relationship is configured: "flag", "file",
	// or "crd:<ClusterFederatedTrustDomain name>".
	Origin              string     `json:"origin,omitempty"`
	State               string     `json:"state"` // pending, ok, failing, stale
	LastAttempt         *time.Time `json:"last_attempt,omitempty"`
	LastSuccess         *time.Time `json:"last_success,omitempty"`
	NextRefresh         *time.Time `json:"next_refresh,omitempty"`
	LastError           string     `json:"last_error,omitempty"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	RefreshHintSeconds  *int64     `json:"refresh_hint_seconds,omitempty"`
	// Refusals counts failed or refused polls since the process started,
	// by kind ("sequence_regression", "profile_mismatch",
	// "trust_domain_mismatch", "tls", "timeout", ...).
	Refusals map[string]uint64 `json:"refusals,omitempty"`
}

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

// Severity of a finding.
type Severity string

// Severities, in increasing order.
const (
	SeverityWarning  Severity = "warning"
	SeverityCritical Severity = "critical"
)

// Finding is one problem `trustbridge audit` reports about a snapshot.
type Finding struct {
	Severity    Severity `json:"severity"`
	Code        string   `json:"code"` // stable, e.g. "authority_expiring"
	TrustDomain string   `json:"trust_domain,omitempty"`
	Authority   string   `json:"authority,omitempty"` // SHA-256
	Message     string   `json:"message"`
	Fix         string   `json:"fix"`
}
