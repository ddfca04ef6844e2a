// Package idtemplate holds what trustbridge's two SPIFFE ID template
// languages share: the OIDC issuers' templates of token claims
// (internal/authn/oidc) and the identity map's templates of attested
// workload facts (internal/authn/identitymap). Both are literal text plus
// {{.Field}} placeholders, deliberately not text/template: no functions,
// pipelines or conditionals, so a reviewer sees every ID a template can
// make, and a value can only ever fill the place its placeholder holds.
// Each language keeps its own placeholders and shape checks; this package
// splits a template into literals and placeholders (Lex), checks a value
// as one path segment (CheckSegment) and checks the ID a template made
// (ID).
//
//	parts, err := idtemplate.Lex(s, literal, placeholder)
//	...
//	if err := idtemplate.CheckSegment(value); err != nil { ... }
//	id, err := idtemplate.ID(rendered, td, segments, "claims")
//
// See the SPIFFE ID specification, §2 (SPIFFE ID) and §2.2 (Path):
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE-ID.md
package idtemplate
