package api

import "time"

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
	// IdentityMap is the identity map node agents are checked against;
	// nil without one.
	IdentityMap *IdentityMap `json:"identity_map,omitempty"`
	// RequireHSM is the server's --require-hsm: its own roots and JWT
	// keys must live in a key manager (KeyStorage other than "state").
	RequireHSM bool `json:"require_hsm,omitempty"`
	// CA is the local CA's issuance settings and, in upstream mode, its
	// upstream's health; nil from a server that predates them.
	CA *CAStatus `json:"ca,omitempty"`
	// OIDCIssuers are the OIDC issuers of JWT-SVIDs the server names, ours
	// first, as in /v1/trust; nil without --jwt-issuer and
	// --relay-jwt-issuer, and from servers that predate them.
	OIDCIssuers []OIDCIssuer `json:"oidc_issuers,omitempty"`
	// ClusterTrustBundles is --cluster-trust-bundle-signer's distribution
	// as the leader last rendered it; nil without it, and on followers.
	ClusterTrustBundles *ClusterTrustBundles `json:"cluster_trust_bundles,omitempty"`
}

// ClusterTrustBundles is the leader's ClusterTrustBundle per trust domain:
// the signer they are linked to and the trust domains left without one.
type ClusterTrustBundles struct {
	Signer  string               `json:"signer"`
	Skipped []SkippedTrustBundle `json:"skipped"`
}

// SkippedTrustBundle is a trust domain the trust store holds that has no
// ClusterTrustBundle, and why (too_large, no_ca_authorities,
// name_collision).
type SkippedTrustBundle struct {
	TrustDomain string `json:"trust_domain"`
	Reason      string `json:"reason"`
	Message     string `json:"message"`
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
