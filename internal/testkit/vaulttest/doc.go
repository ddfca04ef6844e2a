// Package vaulttest runs HashiCorp Vault's JWT auth method
// (github.com/hashicorp/vault-plugin-auth-jwt, the code behind Vault's
// `auth/jwt` mount) in process against a real trustbridge binary: the
// server runs with --jwt-issuer and an https_web bundle endpoint, so that
// it serves the issuer's OIDC discovery document
// (<issuer>/.well-known/openid-configuration) and JWKS (<issuer>/keys);
// `trustbridge jwt mint` asks its certificate service for JWT-SVIDs; and
// Vault's backend, built by its own Factory over logical.InmemStorage,
// is configured as an operator would (`vault write auth/jwt/config
// oidc_discovery_url=...`, or jwks_url with bound_issuer) and logs the
// workload in. A role bound to the workload's SPIFFE ID and audience lets
// it in, named by its SPIFFE ID; a role bound to another SPIFFE ID, and a
// token for another audience, are refused. It runs once per
// --jwt-key-type (ES256, ES384, RS256).
//
// It is a module of its own so that Vault's SDK and its dependencies
// never enter trustbridge's dependency graph. The tests drive the binary
// as a subprocess and import no trustbridge package:
//
//	make vault-tests
//	# or, with a binary built elsewhere:
//	cd internal/testkit/vaulttest && TRUSTBRIDGE_BIN=/path/to/trustbridge go test ./...
//
// Without TRUSTBRIDGE_BIN the tests skip, unless TRUSTBRIDGE_VAULT_TESTS=require,
// which fails them instead.
package vaulttest
