package ca

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// checkNameConstraints refuses an intermediate under which certificates
// this CA issues would not verify: a DNS name constraint of it, or of a CA
// above it, that refuses a name of our workloads (Config.WorkloadDNSZone:
// every name below it) or of our serving certificates
// (Config.ServingDNSNames). A verifier checks every name of a leaf against
// every constraint of its chain, so such a leaf would fail even for a
// client that checks only its SPIFFE ID. It runs when an intermediate is
// obtained, at the first start or a renewal: the current intermediate
// keeps signing, and the error says which flag to change.
func (m *manager) checkNameConstraints(upstream string, c *UpstreamChain) error {
	zone, serving := m.cfg.WorkloadDNSZone, m.cfg.ServingDNSNames
	if zone == "" && len(serving) == 0 {
		return nil
	}
	for _, cert := range constrainingPath(c) {
		if len(cert.PermittedDNSDomains)+len(cert.ExcludedDNSDomains) == 0 {
			continue
		}
		if zone != "" && !zoneAdmitted(cert, zone) {
			return upstreamErrorf(upstream, "certificate %s %s, so the workload DNS names under %q (--workload-dns-name-template) would not verify: "+
				"give this server a template whose zone the upstream permits (a trustbridge upstream permits the zone of its own --workload-dns-name-template "+
				"and its --downstream-dns-domain, none without either), or have the upstream's operator cover it with either", describe(cert), describeDNSConstraints(cert), zone)
		}
		for _, n := range serving {
			if !nameAdmitted(cert, n) {
				return upstreamErrorf(upstream, "certificate %s %s, so the serving certificate's DNS name %q (--grpc-dns-names) would not verify: "+
					"drop it or use a name in a zone the upstream permits (a trustbridge upstream permits the zone of its own --workload-dns-name-template "+
					"and its --downstream-dns-domain, none without either)", describe(cert), describeDNSConstraints(cert), n)
			}
		}
	}
	return nil
}

// constrainingPath is the chain of c and the roots that signed its top:
// the CA certificates whose constraints a leaf under it meets.
func constrainingPath(c *UpstreamChain) []*x509.Certificate {
	path := slices.Clone(c.Chain)
	top := c.Chain[len(c.Chain)-1]
	for _, r := range c.Roots {
		if top.CheckSignatureFrom(r) == nil {
			path = append(path, r)
		}
	}
	return path
}

// dnsMatches is the dNSName constraint match of RFC 5280 §4.2.1.10, as
// crypto/x509 applies it: name is constraint or below it, only below it
// when constraint starts with '.', and "" matches every name. Names
// compare without regard to case.
func dnsMatches(name, constraint string) bool {
	name, constraint = strings.ToLower(name), strings.ToLower(constraint)
	switch {
	case constraint == "":
		return true
	case constraint[0] == '.':
		return len(name) > len(constraint) && strings.HasSuffix(name, constraint)
	}
	return name == constraint || strings.HasSuffix(name, "."+constraint)
}

// nameAdmitted reports whether c's DNS constraints let name through.
func nameAdmitted(c *x509.Certificate, name string) bool {
	matches := func(constraint string) bool { return dnsMatches(name, constraint) }
	permitted := len(c.PermittedDNSDomains) == 0 || slices.ContainsFunc(c.PermittedDNSDomains, matches)
	return permitted && !slices.ContainsFunc(c.ExcludedDNSDomains, matches)
}

// zoneAdmitted reports whether c's DNS constraints let every name below
// zone through: a permitted domain holds the zone, and no excluded one
// holds it or lies below it.
func zoneAdmitted(c *x509.Certificate, zone string) bool {
	holds := func(constraint string) bool { return dnsMatches(zone, strings.TrimPrefix(constraint, ".")) }
	below := func(constraint string) bool { return dnsMatches(strings.TrimPrefix(constraint, "."), zone) }
	permitted := len(c.PermittedDNSDomains) == 0 || slices.ContainsFunc(c.PermittedDNSDomains, holds)
	return permitted && !slices.ContainsFunc(c.ExcludedDNSDomains, holds) && !slices.ContainsFunc(c.ExcludedDNSDomains, below)
}

// describeDNSConstraints says what c's DNS constraints allow, for errors.
func describeDNSConstraints(c *x509.Certificate) string {
	if slices.Contains(c.ExcludedDNSDomains, "") || slices.Contains(c.ExcludedDNSDomains, ".") {
		return "excludes every DNS name"
	}
	var parts []string
	if len(c.PermittedDNSDomains) > 0 {
		parts = append(parts, fmt.Sprintf("permits DNS names only under %q", c.PermittedDNSDomains))
	}
	if len(c.ExcludedDNSDomains) > 0 {
		parts = append(parts, fmt.Sprintf("excludes DNS names under %q", c.ExcludedDNSDomains))
	}
	return strings.Join(parts, " and ")
}

// admitsDNSNames refuses a workload DNS name that a DNS name constraint of
// m's chain refuses: the names a workload gets from an identity map are
// known only when it asks, unlike the template's zone, which
// checkNameConstraints matched when the intermediate was obtained. A leaf
// carrying such a name would fail every verifier's check of its chain,
// even one that looks at its SPIFFE ID only, so it is refused with the
// constraint and what to change instead.
func (m SigningMaterial) admitsDNSNames(id spiffeid.ID, names []string) error {
	if len(names) == 0 {
		return nil
	}
	for _, cert := range m.constrainingPath() {
		if len(cert.PermittedDNSDomains)+len(cert.ExcludedDNSDomains) == 0 {
			continue
		}
		for _, n := range names {
			if !nameAdmitted(cert, n) {
				return fmt.Errorf("ca: %w: DNS name %q of %s: CA certificate %s %s, so a certificate carrying it would not verify; "+
					"give the workload only names the upstream permits (its identity map rules' dnsNames), or have the upstream's operator "+
					"permit them (a trustbridge upstream: --downstream-dns-domain)", ErrIdentityNotAllowed, n, id, describe(cert), describeDNSConstraints(cert))
			}
		}
	}
	return nil
}

// constrainingPath is m's signing certificate, the intermediates above it
// and the roots that issued the top one: the certificates whose
// constraints a leaf m signs meets. Roots are matched by name and key
// identifier, not by signature, which would cost a verification per leaf.
func (m SigningMaterial) constrainingPath() []*x509.Certificate {
	path := append([]*x509.Certificate{m.Cert}, m.Intermediates...)
	top := path[len(path)-1]
	if bytes.Equal(top.RawIssuer, top.RawSubject) {
		return path
	}
	for _, r := range m.Roots {
		if r != top && bytes.Equal(r.RawSubject, top.RawIssuer) &&
			(len(top.AuthorityKeyId) == 0 || bytes.Equal(r.SubjectKeyId, top.AuthorityKeyId)) {
			path = append(path, r)
		}
	}
	return path
}
