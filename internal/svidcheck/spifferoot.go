// Package spifferoot tells which trust domain a root certificate names.
//
// trustbridge's roots, like SPIRE's, carry one URI SAN, spiffe://<td> with
// no path; a plug-in or Istio-style CA's roots usually carry none. The
// certificate clients (which must not file a peer's root under the local
// trust domain) read the one trust domain a root names with TrustDomain.
// The certificate service's merged roots (which must not hand a peer's
// root out as one of ours) keep a peer's root only if NamesOnly its trust
// domain: a root of any other shape may still name ours to some client.
package svidcheck

import (
	"crypto/x509"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TrustDomain is the trust domain r names in its one URI SAN, spiffe://<td>
// with no path; ok is false for any other root.
func RootTrustDomain(r *x509.Certificate) (td spiffeid.TrustDomain, ok bool) {
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
func RootTrustDomains(roots []*x509.Certificate) (named []spiffeid.TrustDomain, anonymous bool) {
	for _, r := range roots {
		td, ok := RootTrustDomain(r)
		switch {
		case !ok:
			anonymous = true
		case !slices.Contains(named, td):
			named = append(named, td)
		}
	}
	return named, anonymous
}

// NamesOnly reports whether every URI SAN of r with scheme spiffe is a
// SPIFFE ID of td, with or without a path; true for a root with none. A
// spiffe URI go-spiffe cannot parse counts against it: a laxer client
// (one that lowercases, say) may still read a trust domain from it.
func RootNamesOnly(r *x509.Certificate, td spiffeid.TrustDomain) bool {
	for _, u := range r.URIs {
		if !strings.EqualFold(u.Scheme, "spiffe") {
			continue
		}
		if id, err := spiffeid.FromURI(u); err != nil || id.TrustDomain() != td {
			return false
		}
	}
	return true
}
