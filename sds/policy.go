package sds

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// DeniedSAN is the only URI SAN a denied trust domain's validation
// context accepts. No SPIFFE ID can equal it (it is not a spiffe:// URI),
// and no CA could issue it anyway: the sentinel CA's key is gone.
const DeniedSAN = "urn:trustbridge:trust-policy:denied"

// DeniedSubjectPrefix begins the subject common name of the sentinel CA
// of a denied trust domain, followed by "<trust domain> denied", so that
// whoever reads Envoy's config dump sees why it trusts nothing there.
const DeniedSubjectPrefix = "trustbridge trust policy: "

// Decision-key placeholders of the validation cache: resources that do
// not depend on the caller's decision share one encoding.
const (
	// anyDecision: the local trust domain, an unrestricted grant, or no
	// policy.
	anyDecision = ""
	// deniedDecision: the explicit denial of one trust domain. Decision
	// keys are hex, so this never collides with one.
	deniedDecision = "!denied"
)

// decisionKeyFor is the cache key of resource p under d: one encoding per
// Trust serves every caller whose decision has the same effect on it.
func decisionKeyFor(p parsedName, d trustpolicy.Decision, local spiffeid.TrustDomain) string {
	switch p.kind {
	case kindTrustDomain:
		if p.td == local {
			return anyDecision
		}
		g, ok := d.Allows(p.td)
		switch {
		case !ok:
			return deniedDecision
		case len(g.Peers) == 0:
			return anyDecision
		}
	}
	return d.Key()
}

// sanMatcher is a URI SAN matcher for one peer pattern or trust domain.
// Only URI SANs: Envoy's SPIFFE validator ignores every other type.
func sanMatcher(value string, prefix bool) *tlsv3.SubjectAltNameMatcher {
	m := &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: value}}
	if prefix {
		m = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: value}}
	}
	return &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: m}
}

// grantMatchers are the matchers accepting what g allows of its trust
// domain: its peers, or every member ("spiffe://<td>/", so that
// spiffe://td.example.evil never matches td.example).
func grantMatchers(td spiffeid.TrustDomain, g trustpolicy.Grant) []*tlsv3.SubjectAltNameMatcher {
	if len(g.Peers) == 0 {
		return []*tlsv3.SubjectAltNameMatcher{sanMatcher(td.IDString()+"/", true)}
	}
	out := make([]*tlsv3.SubjectAltNameMatcher, len(g.Peers))
	for i, p := range g.Peers {
		out[i] = sanMatcher(p.SAN())
	}
	return out
}

// tdSecret is spiffe://<td> (or ROOTCA) for an allowed trust domain: its
// roots, and only its allowed peers when the grant names some.
func tdSecret(name string, b *x509bundle.Bundle, g trustpolicy.Grant) *tlsv3.Secret {
	s := trustedCASecret(name, appendPEM(nil, b.X509Authorities()...))
	if len(g.Peers) > 0 {
		s.GetValidationContext().MatchTypedSubjectAltNames = grantMatchers(b.TrustDomain(), g)
	}
	return s
}

// deniedSecret is the explicit answer for a denied trust domain: Envoy
// must get a validation context (an absent resource leaves it waiting
// with whatever it had, and a context without trusted_ca verifies
// nothing), so it trusts one sentinel CA no one holds the key of, and
// accepts only a SAN no certificate carries. Never another domain's roots.
func deniedSecret(name string, sentinel *x509.Certificate) *tlsv3.Secret {
	s := trustedCASecret(name, appendPEM(nil, sentinel))
	s.GetValidationContext().MatchTypedSubjectAltNames = []*tlsv3.SubjectAltNameMatcher{sanMatcher(DeniedSAN, false)}
	return s
}

// newSentinelCA mints the self-signed CA of td's denial and throws its
// key away, so that nothing can ever chain to it.
func newSentinelCA(td spiffeid.TrustDomain, now time.Time) (*x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: DeniedSubjectPrefix + td.Name() + " denied"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(100 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("minting the sentinel CA of %s: %w", td.Name(), err)
	}
	return x509.ParseCertificate(der)
}
