// Package bundleserver serves SPIFFE bundle endpoints: the local trust
// domain's bundle (and, for relays, other bundles it holds) as a JWKS
// document with spiffe_sequence and spiffe_refresh_hint, over HTTPS in the
// https_web (Web PKI) and https_spiffe (X509-SVID) profiles.
//
// This package is being built; see the project issues for its scope. It
// serializes with internal/bundledoc, whose Marshal is deterministic so a
// document can be rendered once per change and served with a strong ETag.
//
// Spec: SPIFFE Federation §4 (bundle endpoint), §5.2 (endpoint profiles).
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#4-spiffe-bundle-endpoint
package bundleserver
