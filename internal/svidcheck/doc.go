// Package svidcheck is trustbridge's one X509-SVID chain check. Every place
// that authenticates an X509-SVID goes through Verify: federation/trust's
// Verifier (federated peers, https_spiffe bundle endpoints), the mTLS
// authenticator of the SDS and certificate services (internal/authn) and
// the certificate service client (internal/caclient, the node agent).
// It lives in internal/ so that those packages, which must not import a
// domain package, share it instead of each calling x509svid.Verify with
// its own pre-checks.
//
// Verify is go-spiffe's x509svid.Verify with three things go-spiffe does
// not do: the URI SAN must be a canonical SPIFFE ID exactly as encoded in
// the certificate (LeafID; go-spiffe parses crypto/x509's re-serialized
// url.URL), the leaf must name a workload (non-empty path), and the
// extended key usage asked for must be allowed along the verified chain,
// as crypto/x509 checks it (x509svid.Verify asks for any usage). The
// chain is verified against the bundle of the leaf's own trust domain and
// no other.
//
//	id, chains, err := svidcheck.Verify(certs, bundles, x509.ExtKeyUsageClientAuth, x509svid.WithTime(now))
//
// Spec: X509-SVID §2 (exactly one URI SAN), §3.1 (leaf IDs have a path),
// §4.3 and §5.2 (leaf validation), §5.1 (path validation); SPIFFE
// Federation §7.3 (the trust domain–bundle binding is preserved).
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#52-leaf-validation
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#73-preserving-the-trust-domain-bundle-binding
package svidcheck
