// Package certservice serves the embedded CA to workloads and agents over
// gRPC, wire-compatible with Istio's certificate API
// (istio.v1.auth.IstioCertificateService/CreateCertificate, the generated
// types of istio.io/api/security/v1alpha1).
//
// The identity in an issued certificate always comes from authentication
// (an authn.Authenticator: mTLS X509-SVID of the local trust domain, a
// Kubernetes service account token, a bootstrap token), never from the CSR:
// a CSR that asks for another identity is refused with PermissionDenied and
// nothing is signed. Each refusal maps to one status code: Unauthenticated
// (no or bad credentials), PermissionDenied (identity not allowed),
// InvalidArgument (bad CSR or lifetime), ResourceExhausted (signing queue
// full or waited in too long, or the caller's rate limit), Unavailable (the
// CA cannot sign now, or the authentication backend is down). Errors from
// the CA's internals are logged, not returned.
//
// Signing is admitted by a bounded queue (admission.go): a few signings
// at once (Config.Concurrency), the rest waiting their turn in arrival
// order, up to Config.QueueSize of them and Config.QueueTimeout each, so
// a burst of first certificates (a node restart) is served rather than
// refused. A request waits after authentication and authorization and
// before its CSR is parsed, so a waiting request costs memory, not CPU.
//
// Workload DNS names: with Config.WorkloadDNSNames (a workloaddns
// template, --workload-dns-name-template), a certificate whose grant is a
// Kubernetes token (kubernetes-jwt, kubernetes-issuer), on a first issuance
// or copied into a renewal, also carries the template's DNS name beside
// its SPIFFE ID (X509-SVID §2). A CSR asking for DNS names is refused,
// except from a node agent asking for a workload (ImpersonatedIdentity)
// whose Impersonator is a NameImpersonator that confirms exactly those
// names: those the server's identity map gives a running pod of the
// agent's node with that ID. The certificate then carries them and the
// template's name.
//
// Renewals end with their grant. Every certificate records, in a
// non-critical private extension (authn.GrantOID), the credential that
// first granted its identity: a bootstrap token (by a reference, never the
// token) or a Kubernetes service account (namespace/name and UID), and
// when. A renewal with an X509-SVID copies the grant of the presented,
// verified leaf unchanged, so every certificate of a chain names where the
// chain began. Before signing a renewal, Config.Grants decides whether that
// credential still exists; when it is gone the renewal is refused with
// PermissionDenied (reason grant_revoked), and when that cannot be told
// right now, with Unavailable (the caller retries with its still valid
// certificate). Config.MaxRenewalLifetime, when set, also refuses chains
// granted longer ago than that. A leaf without the extension (issued
// before grants were recorded, or by `trustbridge ca issue`) is a legacy
// chain: it renews with a warning, its grant dated at its NotBefore, so
// only MaxRenewalLifetime ends it. A leaf SDS minted for Envoy is marked
// (authn.GrantMethodSDS) and never renews. Every grant check is
// counted in trustbridge_certservice_renewal_grant_checks_total and every
// issuance logs its grant.
//
// The response's cert_chain has istiod's layout: the leaf and each
// intermediate, one PEM certificate per element, then ONE element holding
// every root the caller should trust, concatenated: the roots that sign
// the leaf first (the CA's published roots, a successor included before it
// signs), then, with Config.MergedRoots (the server's --ca-response-roots
// merged), the roots of every federated trust domain that the trust policy
// decision of the certificate's workload (Config.Policy, the decision SDS
// and WatchBundles follow) allows to all its members; one it allows only
// for some peers is left out, as a flat list cannot limit peers, and a
// policy change applies from the next request. Istio's agent takes that
// last element as its whole ROOTCA when its CA client has no separate root
// fetch, so one element per root would leave a sidecar with only the last
// root through every rotation; ztunnel splits that last element into its
// roots too, and wants every other element to be one certificate, as here.
//
// trustbridge.identity.v1.IdentityService (internal/identityapi) shares
// the server, the authenticators, the per-identity rate limit, the
// signing queue and the refusal logs, and is registered when Config.JWT
// or Config.Bundles is set. Its callers authenticate as for a certificate,
// except that an X509-SVID whose grant no longer stands, or SDS minted,
// and a single-use bootstrap token (which buys one certificate) are
// refused, as on SDS. MintJWTSVIDs signs a batch of them, up to 64, the
// caller authenticated once, each item judged and charged as
// MintJWTSVID's request, the batch waiting in the signing queue once.
// MintJWTSVID signs a JWT-SVID whose subject is the
// caller's proven identity, or, with impersonated_identity, a workload
// the Impersonator lets the caller (a node agent, by its token) act for,
// as for that workload's certificate; for 1 to
// MaxAudiences audiences of at most MaxAudienceBytes each; ttl_seconds 0
// takes the signer's default and a larger one is clamped by it, and both
// to what the caller's credential has left (under a second: Unauthenticated); without
// Config.JWT it answers FailedPrecondition. WatchBundles streams the
// caller's SPIFFE bundle map: at once, then whenever Config.Bundles or
// the caller's Config.Policy decision changes what it holds, never the
// same bytes twice. The caller's own trust domain is always in it; a
// federated one is in it when the decision allows it to every member,
// named in withheld_trust_domains when allowed only for some peers
// (which a bundle cannot say), or, when the request asks for peer_limits,
// in the map with its peers in peer_limits; absent when denied. A node
// agent may watch a workload's trust instead (impersonated_identity),
// granted as CreateCertificate's ImpersonatedIdentity, decided as for a
// certificate of that workload, re-authorized with every
// re-authentication (PermissionDenied once the pod left the node), and
// charged to the workload's stream slots. Every message names its subject
// (spiffe_id) and, to callers of Config.TrustDomain, the CA's tainted
// authorities (Config.Taints, at most MaxTaintedAuthorities, sorted) with
// the window clients spread their re-issuance over
// (Config.ReissueSpread, DefaultReissueSpread): a taint change reaches
// every stream at once. Streams are
// bounded (Config.MaxBundleWatches, MaxBundleWatchesPerIdentity, freed by
// keepalive within KeepaliveTime+KeepaliveTimeout of a peer vanishing; a
// message over MaxBundleMessageSize ends the stream), re-authenticate every
// Config.WatchReauthInterval, end with Unauthenticated when the
// credential that opened them expires (authn.Identity.NotAfter: the
// X509-SVID's NotAfter, a JWT bearer token's exp, a bootstrap token's
// expires=), and with Unavailable when the server stops.
//
//	svc, err := certservice.New(certservice.Config{
//		Signer:        authority, // *ca.Authority
//		Authenticator: authn.Chain{authn.NewX509SVID(td, localRoots, nil), bootstrap},
//		MergedRoots:   true, // Bundles' roots as Policy allows each caller
//		Grants: map[string]authn.GrantChecker{
//			authn.MethodBootstrapToken: bootstrap, // *authn.BootstrapTokens
//			authn.MethodKubernetesJWT:  serviceAccounts, // *authn.ServiceAccountGrants
//		},
//		MaxRenewalLifetime: 30 * 24 * time.Hour,
//		JWT:                authority,    // JWT-SVIDs (IdentityService)
//		Bundles:            trustBundles, // every trust domain's bundle, for WatchBundles
//		Policy:             access,       // *trustpolicy.Access; nil: every trust domain
//	})
//	if err != nil {
//		return err
//	}
//	srv := certservice.NewServer(svc, certservice.TLSConfig(servingCert.GetCertificate), ln)
//	return srv.Run(ctx)
//
// Specs: X509-SVID §5 (leaf certificates); JWT-SVID §3 (claims) and the
// SPIFFE Trust Domain and Bundle spec §4 (bundle maps); Istio's CA API
// (https://github.com/istio/api/blob/master/security/v1alpha1/ca.proto);
// SPIRE GHSA-h746-rm5q-8mgq on why the CSR never names the identity.
package certservice
