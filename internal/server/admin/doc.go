// Package admin is trustbridge's admin HTTP API: liveness and readiness,
// Prometheus metrics, the CA's published roots, the federation's polling
// state and an operator refresh, and the trust snapshot as JSON and as the
// read-only status page.
//
//	h := admin.New(admin.Config{
//		TrustDomain: td, CA: authority, Ready: ready, Gatherer: reg,
//		Federation: poller, Trust: store, Origin: origin,
//		Actor: hostname, IsLeader: elector.IsLeader,
//	})
//	srv := &http.Server{Handler: hostChecker.Wrap(h)}
//
// Routes:
//   - GET /healthz, GET /readyz (503 with the reason when Config.Ready fails)
//   - GET /metrics (Config.Gatherer)
//   - GET /v1/trust: api.Trust, the CA's roots and JWT signing keys with their
//     rotation state, and the OIDC issuers served (Config.JWTIssuers)
//   - GET /v1/bundle: the local trust domain's SPIFFE bundle document, for
//     the operators of https_spiffe peers (their bootstrap bundle)
//   - GET /v1/bundle/fetchers: api.BundleFetchers, the clients of the bundle
//     endpoint with their last fetch and the sequence served to them
//     (Config.Fetchers; 404 on a server without a bundle endpoint)
//   - GET /v1/federation: []api.FederationStatus, one per trust domain whose
//     bundle the server holds besides its own: each polled one, and each
//     held as set (bundle set, a bundle file; state static, from Trust)
//   - POST /v1/federation/refresh?trust_domain=TD: poll TD now; refused
//     with 403 when a browser sends it cross-site, 409 on a follower, 429
//     more often than once a second
//   - GET /v1/federation/relationships: []api.Relationship, every federated
//     trust domain with its endpoint and origin (flag, file, crd:<name>,
//     runtime), and those trusted by a static bundle (origin static)
//   - POST /v1/federation/relationships (?force replaces, ?no_fetch skips
//     the first fetch): add one endpoint, the body one entry in the
//     --federation-config schema with its bundle inline; DELETE
//     /v1/federation/relationships/{trust_domain}: remove one added at run
//     time; PUT /v1/bundles/{trust_domain}: a SPIFFE bundle or PEM
//     certificates as its bootstrap or static bundle. Mounted with a
//     Config.Manager; they need "Authorization: Bearer <Config.Token>"
//     (401 otherwise), or a connection of the admin socket (OverSocket),
//     and are refused cross-site (403) and on a follower (409: only the
//     leader writes the audit log)
//   - GET /v1/ca/authorities: api.CAAuthorities, the CA's X.509
//     authorities and JWT keys with their state (tainted and revoked ones
//     included) and, with Config.Signed, what each signed that is still
//     valid; POST /v1/ca/authorities: an api.CAAuthorityChange (prepare,
//     activate, taint, revoke; strict JSON, 400 otherwise, 413 over 4 KiB)
//     answered with an api.CAAuthorityResult, 409 where the CA refuses it
//     or revoke would fail workloads still presenting what the authority
//     signed (unless force), 404 for an unknown authority; guarded as the
//     federation mutations are and audited through Config.Audit. Mounted
//     with a Config.Authorities
//   - POST /v1/svid/x509: an api.X509SVIDMint (a SPIFFE ID of our trust
//     domain and a CSR, whose key alone is signed: the private key stays
//     with the operator) answered with an api.X509SVIDMinted, the chain
//     and the roots it verifies against, the lifetime clamped to
//     Config.MaxWorkloadTTL; POST /v1/svid/jwt: an api.JWTSVIDMint
//     answered with an api.JWTSVIDMinted. Strict JSON (400), 413 over
//     16 KiB, 400 for another trust domain's ID; guarded as the
//     federation mutations are, each audited (x509_svid_minted,
//     jwt_svid_minted, with who asked). Mounted with a Config.Mint
//   - GET /v1/snapshot (?compact: unindented) and /ui: the api.Snapshot
//     of everything trusted, as JSON and as statusui's page; mounted only
//     with a Config.Trust store
//
// The package checks no Host header: the caller wraps the handler in a
// hostcheck.Checker (DNS rebinding) and binds the listener.
package admin
