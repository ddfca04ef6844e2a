// Package spifferoot tells which trust domain a root certificate names.
//
// trustbridge's roots, like SPIRE's, carry one URI SAN, spiffe://<td> with
// no path; a plug-in or Istio-style CA's roots usually carry none. The
// certificate service's merged roots (which must not hand a peer's root
// out as one of ours) and the certificate clients (which must not file a peer's root under the
// local trust domain) judge roots with the same function.
package spifferoot

import (
	"crypto/x509"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TrustDomain is the trust domain r names in its one URI SAN, spiffe://<td>
// with no path; ok is false for any other root.
func TrustDomain(r *x509.Certificate) (td spiffeid.TrustDomain, ok bool) {
	if len(r.URIs) != 1 {
		return spiffeid.TrustDomain{}, false
	}
	id, err := spiffeid.FromURI(r.URIs[0])
	if err != nil || id.Path() != "" {
		return spiffeid.TrustDomain{}, false
	}
	return id.TrustDomain(), true
}

// TrustDomains lists the trust domains roots name, in order of first
// appearance, and whether some root names none.
func TrustDomains(roots []*x509.Certificate) (named []spiffeid.TrustDomain, anonymous bool) {
	for _, r := range roots {
		td, ok := TrustDomain(r)
		switch {
		case !ok:
			anonymous = true
		case !slices.Contains(named, td):
			named = append(named, td)
		}
	}
	return named, anonymous
}
