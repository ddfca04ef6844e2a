// Package logattr names the structured-log attribute keys every package
// uses, so logs from the CA, the bundle server and federation can be
// queried by the same keys.
package logattr

// Attribute keys.
const (
	TrustDomain = "trust_domain"
	EndpointURL = "endpoint_url"
	SPIFFEID    = "spiffe_id"
	Sequence    = "sequence"
	// OldSequence is the sequence a change replaced.
	OldSequence = "old_sequence"
	RootID      = "root_id"
	// KeyID is a JWT signing key's kid.
	KeyID       = "kid"
	Roots       = "roots"
	Error       = "error"
	Component   = "component"
	DataDir     = "data_dir"
	Address     = "address"
	RefreshHint = "refresh_hint"
	Warning     = "warning"
	// DNSNames are the DNS SANs of a certificate (internal/workloaddns).
	DNSNames = "dns_names"
	// PolicySource is a trust policy source ("file:<path>", "crd"), and
	// PolicyRules the number of rules it holds (internal/trustpolicy).
	PolicySource = "policy_source"
	PolicyRules  = "policy_rules"
	// The grant a certificate descends from (internal/authn.Grant).
	GrantMethod = "grant_method"
	GrantRef    = "grant_ref"
	GrantUID    = "grant_uid"
	GrantedAt   = "granted_at"
	// Rule names a trust policy rule (internal/trustpolicy).
	Rule = "rule"
	// Issuer is a token issuer's configured name, IssuerURL its URL
	// (internal/authn/oidc), and Keys how many keys it holds.
	Issuer    = "issuer"
	IssuerURL = "issuer_url"
	Keys      = "keys"
	// Listener names a TCP listener ("grpc", "bundle", "admin") in the
	// logs of its connection limits (internal/server/connlimit).
	Listener = "listener"
	// Impersonated is the workload a node agent asked to act for
	// (Istio's ImpersonatedIdentity, a bundle stream's
	// impersonated_identity), beside the caller's own spiffe_id.
	Impersonated = "impersonated"
)
