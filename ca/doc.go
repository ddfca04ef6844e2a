// Package ca is trustbridge's embedded certificate authority: a self-signed
// or plugged-in root, a rotation schedule that publishes new roots several
// refresh hints before they sign (SPIFFE Federation §4.1), and signing of
// workload CSRs for identities the caller has proved.
//
// This package is being built; see the project issues for its scope.
//
// Spec: X509-SVID §4 (signing certificates), §5 (leaf certificates).
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md
package ca
