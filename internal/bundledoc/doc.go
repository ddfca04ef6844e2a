// Package bundledoc reads and writes SPIFFE bundle documents and bundle maps.
//
// It is a thin layer in front of go-spiffe's spiffebundle model, built on
// go-jose/v4, that follows the specs exactly where go-spiffe and go-jose do
// not. JWK elements are decoded one at a time, so a key the spec says to
// ignore (unknown kty or use, unsupported curve, x509-svid without x5c) is
// skipped with a Warning instead of failing the whole set. Everything that
// could widen trust is refused: a non-CA x509 authority, an x5c key that
// differs from the JWK, a missing or duplicate kid, private key material,
// RSA keys outside 2048–8192 bits, a sequence that is not an unsigned 64-bit
// integer, duplicate members, trailing data and invalid UTF-8. Marshal
// output is deterministic, so a server can serialize once per change and a
// strong ETag stays stable.
//
// trustbridge's own extension, the top-level "trustbridge_revoked" member
// (RevokedMember), lists the authorities a publisher revoked: its
// publishers write it with MarshalWithRevocations and its peers read it
// with ParseRevocations; other consumers ignore it, as the spec lets them.
//
//	b, warnings, err := bundledoc.Read(td, resp.Body, bundledoc.DefaultMaxSize)
//	if err != nil {
//		return err // keep the last good bundle
//	}
//	for _, w := range warnings {
//		log.Warn("bundle element ignored", "warning", w.String())
//	}
//	doc, err := bundledoc.Marshal(b)
//
// Specs: SPIFFE Trust Domain and Bundle §4 (bundle format) and §5 (bundle
// map), X509-SVID §6 (bundle contents), JWT-SVID §6, RFC 7517 §4.7 (x5c).
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Trust_Domain_and_Bundle.md
package bundledoc
