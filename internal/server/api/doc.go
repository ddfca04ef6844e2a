// Package api is the server's wire model: every JSON document the admin
// listener serves under /v1, which the trustbridge CLI decodes and the
// /ui page renders, and the one function per resource that maps the
// domain's plain values to it. Domain packages (federation, ca,
// trustpolicy, oidc) carry no JSON tags for these documents; a field
// added to one of their values reaches every document that shows it
// through the mapping here.
//
//	resource              document                                 mapping
//	federation status     GET /v1/federation: []FederationStatus   NewFederationStatus, NewHeldStatus
//	                      snapshot's TrustDomain.Federation         NewFederation
//	                      GET /v1/federation/relationships          NewRelationship
//	trust (CA)            GET /v1/trust: Trust                      NewTrust
//	                      snapshot's authorities, ca section        RootAuthority, JWTKeyAuthority, BundleAuthorities, NewCAStatus
//	trust policy          snapshot's trust_policy, trusted_by       NewTrustPolicy, NewTrustedBy, PolicyRules
//	                      GET /v1/policy/explain: Explanation       Explain
//	authn issuers         GET /v1/authn/issuers: Issuers            NewIssuers
//	OIDC issuers served   GET /v1/trust's, snapshot's oidc_issuers  NewOIDCIssuers
//	everything trusted    GET /v1/snapshot: Snapshot                (assembled by the admin handler)
//
// `trustbridge audit` judges a Snapshot into Findings; the golden files
// in internal/server/admin/testdata/wire pin every document's bytes.
package api
