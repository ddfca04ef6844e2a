// Package authn decides who is calling trustbridge's gRPC services (the
// CA certificate service, the Envoy SDS server): it turns what a caller
// presented on one call, a TLS client certificate or a bearer token, into a
// SPIFFE ID. Authorization (may this identity have that certificate?) is the
// caller's business; the identity a certificate is issued for always comes
// from here, never from the CSR.
//
// Three authenticators, normally tried in this order by a Chain, where the
// first success decides (Istio's model):
//
//   - X509SVID: the mTLS client certificate is an X509-SVID of the local
//     trust domain that verifies against the local roots as they are now.
//     SVIDs of federated trust domains never authenticate: they prove an
//     identity to workloads, not to our CA. Chains whose keys, length or
//     subjects would make verification expensive are refused before any
//     signature check; results are cached by chain and bundle, and
//     verifications in flight are capped per client address and in total.
//   - TokenReview: a Kubernetes service account JWT, checked by the API
//     server with a TokenReview bound to an audience (default the trust
//     domain), gives spiffe://<td>/ns/<namespace>/sa/<serviceaccount>.
//     Successes are cached for at most a minute and never past the token's
//     expiry; failures are not cached, so a revoked token stops working
//     within the cache TTL plus the API server's own 10 second token cache.
//     Bearer tokens that are not JWTs are left to the next authenticator and
//     never reach the API server. Before a review, the token must look like
//     a service account token for our audience (algorithm, iss, exp, nbf,
//     iat, aud, sub, kubernetes.io) and, when the API server's service
//     account issuer discovery is readable, carry a signature that verifies
//     against the issuer's keys. At most MaxConcurrentReviews reviews run at
//     once, MaxReviewsPerPeer of them for one client address, and each
//     address may start PeerReviewRate a second; beyond, a new token is
//     refused with ErrUnavailable at once, so a flood of distinct tokens is
//     neither a flood of calls nor a way to starve other callers.
//   - BootstrapTokens: shared secret tokens listed in a file
//     ("token,spiffe-id[,expires=<RFC 3339 time>][,reusable]" per line).
//     This is a bootstrap-only path for laptops and VMs without Kubernetes:
//     get a first SVID with the token, then renew with the SVID. A token is
//     single-use unless its line says reusable: the Identity it proves has
//     a Spend function, which the issuer calls once the certificate is
//     signed and which records the token as consumed in a TokenLedger
//     (FileLedger in the data directory, KubeLedger in a Secret replicas
//     share, with optimistic concurrency), keyed by its grant reference;
//     of concurrent requests with one token exactly one gets a
//     certificate. Consumed and expired tokens are refused
//     (ErrTokenConsumed, ErrTokenExpired); ReusableOnly refuses single-use
//     ones for services that cannot spend them (SDS). Keep the file 0600;
//     tokens are at least 16 characters of the RFC 6750 b64token alphabet
//     (NewBootstrapToken makes 256-bit ones, AppendBootstrapToken adds
//     them), compared in constant time. Run reloads the file; a bad edit
//     keeps the previous tokens and is reported by Err.
//
// Grants: an Identity also carries the credential that first granted it
// (Identity.Grant): the bootstrap token's reference (BootstrapGrantRef, a
// slow PBKDF2 digest of its digest), the service account and its UID from TokenReview,
// or, for an X509-SVID, the grant recorded in the verified leaf's
// extension (GrantOID, read by GrantFromCert; a leaf without one is a
// GrantMethodLegacy grant). A server with a CA reads that grant only from
// leaves its own CA signed (WithOwnIssuers): a downstream intermediate of
// the trust domain verifies against the same roots and could write any
// grant; its leaves get a GrantErr wrapping ErrNotIssuedHere instead.
// BootstrapTokens.CheckGrant and
// ServiceAccountGrants.CheckGrant tell whether such a grant still stands,
// so the certificate service can stop renewal chains whose token or
// service account was removed.
//
// Errors: an authenticator that finds nothing it handles returns an error
// wrapping ErrNoCredentials; one that finds bad credentials wraps
// ErrInvalidCredentials (or ErrUnavailable when the API server could not
// answer). Chain wraps ErrUnauthenticated and every reason; messages never
// contain token bytes. Map them to gRPC codes in the transport.
//
//	x509 := authn.NewX509SVID(td, localRoots, clock.RealClock{})
//	kube, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: cs, TrustDomain: td, Registerer: reg})
//	boot, err := authn.LoadBootstrapTokens("/etc/trustbridge/bootstrap-tokens.csv", td)
//	chain := authn.Chain{x509, kube, boot}
//	id, err := chain.Authenticate(ctx, authn.FromGRPC(ctx))
//	if errors.Is(err, authn.ErrUnauthenticated) { /* codes.Unauthenticated */ }
//
// Specs: X509-SVID §5 (leaf validation) and §4.4 (key usage); RFC 6750 §2.1
// (bearer token syntax); Kubernetes TokenReview (authentication.k8s.io/v1).
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#5-validation
// https://www.rfc-editor.org/rfc/rfc6750#section-2.1
// https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-review-v1/
package authn
