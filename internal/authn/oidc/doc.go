// Package oidc authenticates callers by JWTs of configured issuers,
// verified offline against the keys each issuer publishes through OpenID
// Connect discovery: CI jobs and VMs with a token from their platform
// (GitHub Actions, GitLab, a cloud's instance identity), and pods of other
// Kubernetes clusters whose service account issuer is reachable
// (KindKubernetes), with no TokenReview and no shared secret. Its
// Authenticator sits in an authn.Chain beside the others; a token whose
// "iss" is not configured here is left to them (authn.ErrNoCredentials).
//
// A token is routed by its payload's "iss", and its header's alg, kid
// and crit are read by their exact names, as go-jose reads them ("ISS"
// and "KID" are other members; a name twice is refused). It is verified
// in this order, and refused at the first failure, counted in
// trustbridge_authn_oidc_tokens_total{issuer,result}: the header's alg
// must be one of the issuer's Algorithms (RSA, ECDSA or
// RSA-PSS only: never "none", never HMAC) and no "crit" may be present,
// before any key is fetched; the signature must verify with one of the
// issuer's keys (an unknown kid refetches the keys at most once per
// RefreshInterval); iss must be the issuer, exp present, in the future and
// at most 366 days ahead, nbf and iat not more than a minute in the
// future, aud must hold one of Audiences. These refusals wrap
// authn.ErrInvalidCredentials; keys that cannot be had wrap
// authn.ErrUnavailable. Then every claim rule must hold and the SPIFFE ID
// template must yield an ID in the trust domain; those refusals wrap
// authn.ErrPermissionDenied. Errors name the issuer and never contain
// token bytes.
//
// The SPIFFE ID template is not text/template: it is literal text plus
// {{.TrustDomain}} and {{.Claims.<dotted path>}}, nothing else, and must
// start with spiffe://{{.TrustDomain}}/ (or the trust domain spelled out).
// A path segment holds at most one claim placeholder (literal text beside
// it is fine): two values side by side cannot be told apart
// ({{.Claims.org}}-{{.Claims.repo}} is the same for acme/payments-api and
// acme-payments/api). Every claim value substituted must be a string (or
// a number, by its JSON text) that is exactly one SPIFFE ID path segment:
// 1 to 255 of A-Z a-z 0-9 . - _, not "." or "..". So a value can never
// add a segment, climb out of its place or leave the trust domain: "/",
// "%2F", spaces and look-alike unicode are refused, not escaped. A
// KindKubernetes issuer has no template: its tokens' sub
// system:serviceaccount:<ns>:<sa>, which the kubernetes.io claim must
// repeat, gives spiffe://<td>/ns/<ns>/sa/<sa>.
//
// A claim's dotted path walks nested objects, where a key may itself
// contain dots (kubernetes.io.namespace is claims["kubernetes.io"]["namespace"]).
// A path that resolves more than one way in a token (a flat key
// "kubernetes.io.namespace" beside the nested one) is ambiguous and the
// token is refused, by rules, templates and the Kubernetes identity
// alike, so a rule always judges the value the identity is made of.
//
// A KindOIDC issuer must have at least one claim rule. Its audience is no
// fence: a shared public issuer (GitHub Actions, GitLab, a cloud) signs a
// token with whatever audience anyone asks for, so an issuer without rules
// would give an identity to every one of its users. Restrict it to your
// own tokens with unique, immutable claims (GitHub's repository_owner_id,
// not the renamable repository_owner).
//
// A KindKubernetes issuer's rules are optional, because Istio
// multi-cluster meshes share namespace and service account identities
// across clusters. But such an issuer is trusted for every namespace and
// every service account name, istio-system/istiod included: whoever can
// create a service account in that cluster can take the identity of the
// same name here. Unless the remote cluster is as trusted as this one,
// restrict it with a kubernetes.io.namespace rule.
//
// Configuration (ParseConfig, or ParseConfigNode for the oidc key of the
// server's --config; unknown and duplicate keys, anchors and aliases are
// errors naming the line):
//
//	issuers:
//	- name: github-actions            # metrics label, grant reference
//	  kind: oidc                      # or kubernetes
//	  issuer: https://token.actions.githubusercontent.com
//	  audiences: [spiffe://example.org]
//	  algorithms: [RS256]             # default RS256, ES256
//	  caFile: /etc/trustbridge/issuer-ca.pem   # default: system roots
//	  allowPrivateAddresses: false
//	  claims:                         # at least one for kind oidc; all must hold, each with any listed value
//	  - claim: repository_owner_id    # your organisation's ID, which a rename does not change
//	    values: ["1234567"]
//	  - claim: ref
//	    values: [refs/heads/main]
//	  spiffeID: "spiffe://{{.TrustDomain}}/ci/github/{{.Claims.repository_owner_id}}/{{.Claims.repository_id}}"
//	  maxRenewalLifetime: 24h         # the default; more than 0, at most 8760h
//	- name: cluster-west
//	  kind: kubernetes
//	  issuer: https://oidc.west.example.net
//	  audiences: [trustbridge]
//	  claims:                         # optional for kind kubernetes: without it, every namespace
//	  - claim: kubernetes.io.namespace
//	    values: [payments, shop]
//
// Build IDs and rules from claims that are unique and immutable: GitHub's
// repository_owner_id and repository_id stay with the organisation and
// repository through renames, and a name freed by a rename or deletion
// gets a new ID when it is taken again; free text such as workflow (any
// committer can change it) or a name that can be re-registered can not
// tell one job from another. GitHub's repository ("acme/app") and sub
// ("repo:acme/app:ref:refs/heads/main") contain '/' or ':', which no
// SPIFFE ID path segment may hold, so they cannot be template values
// (every token would be refused); use them, if at all, in rules.
//
// Usage:
//
//	issuers, err := oidc.ParseConfig(data) // then read each CAFile into Roots
//	a, err := oidc.New(oidc.Config{TrustDomain: td, Issuers: issuers, Registerer: reg, Logger: log})
//	go a.Run(ctx) // key warm-up
//	chain := authn.Chain{x509, a, tokenReview, bootstrap}
//	policy.Checkers[authn.MethodOIDC] = a
//	policy.Checkers[authn.MethodKubernetesIssuer] = a
//
// An identity's grant is the issuer's name and a digest of its URL
// (authn.Grant{Method, Ref: Name, UID: authn.IssuerGrantUID(Issuer)});
// CheckGrant revokes renewal chains whose issuer was removed from the
// configuration, changed kind or now has another URL, and ends a chain
// older than the issuer's maxRenewalLifetime (authn.ErrGrantExpired):
// claim rules and a remote cluster's service accounts cannot be checked
// again without a fresh token, so the chain goes back to one (the
// trustbridge agent falls back to its --token-file when a renewal is
// refused).
//
// Specs:
//   - OpenID Connect Discovery 1.0 §4 (the configuration document, the
//     issuer value that must match): https://openid.net/specs/openid-connect-discovery-1_0.html#ProviderConfig
//   - RFC 7519 §4.1 (registered claims iss, sub, aud, exp, nbf, iat): https://www.rfc-editor.org/rfc/rfc7519#section-4.1
//   - RFC 8725, JWT Best Current Practices (algorithm allow-lists, no
//     "none", issuer and audience validation): https://www.rfc-editor.org/rfc/rfc8725
//   - Kubernetes service account issuer discovery: https://kubernetes.io/docs/tasks/configure-pod-container/configure-service-account/#service-account-issuer-discovery
//   - SPIFFE ID §2.2 (path segments): https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE-ID.md#22-path
package oidc
