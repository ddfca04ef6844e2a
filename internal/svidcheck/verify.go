package svidcheck

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Errors every error from Verify wraps one of, so callers can tell them
// apart (and count them under stable labels).
var (
	ErrNoCertificate = errors.New("no certificate presented")
	ErrNotSVID       = errors.New("certificate is not a valid X509-SVID leaf")
	ErrUnknownDomain = errors.New("no bundle for the trust domain")
	ErrChain         = errors.New("chain does not verify against its trust domain's roots")
)

// Verify authenticates certs (leaf first, then any intermediates) as an
// X509-SVID valid for usage (x509.ExtKeyUsageAny for no particular use)
// against the roots bundles holds for the leaf's own trust domain, and
// returns the leaf's SPIFFE ID and the chains x509svid.Verify built, each
// allowing usage. opts go to x509svid.Verify (x509svid.WithTime for an
// injected clock). The ID is returned with the errors that come after it
// is known, for messages; it is authenticated only when err is nil.
func Verify(certs []*x509.Certificate, bundles x509bundle.Source, usage x509.ExtKeyUsage, opts ...x509svid.VerifyOption) (spiffeid.ID, [][]*x509.Certificate, error) {
	if len(certs) == 0 {
		return spiffeid.ID{}, nil, ErrNoCertificate
	}
	if slices.Contains(certs, nil) {
		return spiffeid.ID{}, nil, fmt.Errorf("%w: the chain holds a nil certificate", ErrNotSVID)
	}
	id, err := LeafID(certs[0])
	if err != nil {
		return spiffeid.ID{}, nil, fmt.Errorf("%w: %w", ErrNotSVID, err)
	}
	bundle, err := bundleFor(bundles, id.TrustDomain())
	if err != nil {
		return id, nil, err
	}
	// The bundle itself is the source: it answers for its own trust
	// domain only, so no other trust domain's root can vouch for id.
	_, chains, err := x509svid.Verify(certs, bundle, opts...)
	if err != nil {
		return id, nil, fmt.Errorf("%w: %w", ErrChain, err)
	}
	if chains = allowingUsage(chains, usage); len(chains) == 0 {
		return id, nil, fmt.Errorf("%w: no verified chain allows extended key usage %s", ErrChain, usageName(usage))
	}
	return id, chains, nil
}

// bundleFor asks bundles for td's roots and refuses what cannot anchor an
// X509-SVID of td.
func bundleFor(bundles x509bundle.Source, td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if bundles == nil {
		return nil, fmt.Errorf("%w %q: no bundle source configured", ErrUnknownDomain, td.Name())
	}
	b, err := bundles.GetX509BundleForTrustDomain(td)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w %q: %w", ErrUnknownDomain, td.Name(), err)
	case b == nil || b.Empty():
		return nil, fmt.Errorf("%w %q: no X.509 roots held for it", ErrUnknownDomain, td.Name())
	case b.TrustDomain() != td:
		// Never let one trust domain's keys stand for another's.
		return nil, fmt.Errorf("%w %q: the bundle source returned roots of %q", ErrUnknownDomain, td.Name(), b.TrustDomain().Name())
	}
	return b, nil
}

// allowingUsage keeps the chains crypto/x509 would accept for usage:
// every certificate that lists extended key usages lists usage or any.
// x509svid.Verify asks for any usage, so this is the check it skipped.
func allowingUsage(chains [][]*x509.Certificate, usage x509.ExtKeyUsage) [][]*x509.Certificate {
	if usage == x509.ExtKeyUsageAny {
		return chains
	}
	return slices.DeleteFunc(chains, func(chain []*x509.Certificate) bool {
		return slices.ContainsFunc(chain, func(c *x509.Certificate) bool { return !AllowsUsage(c, usage) })
	})
}

// AllowsUsage reports whether c may be used for usage: it lists no
// extended key usage, or lists usage or any.
func AllowsUsage(c *x509.Certificate, usage x509.ExtKeyUsage) bool {
	if len(c.ExtKeyUsage) == 0 && len(c.UnknownExtKeyUsage) == 0 {
		return true
	}
	return slices.Contains(c.ExtKeyUsage, usage) || slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageAny)
}

func usageName(u x509.ExtKeyUsage) string {
	switch u {
	case x509.ExtKeyUsageServerAuth:
		return "serverAuth"
	case x509.ExtKeyUsageClientAuth:
		return "clientAuth"
	default:
		return fmt.Sprintf("%d", u)
	}
}

// LeafID applies the X509-SVID leaf rules and returns the leaf's SPIFFE ID.
func LeafID(leaf *x509.Certificate) (spiffeid.ID, error) {
	if leaf.IsCA {
		return spiffeid.ID{}, errors.New("leaf is a CA (basic constraints CA=true)")
	}
	if leaf.KeyUsage&x509.KeyUsageCertSign != 0 {
		return spiffeid.ID{}, errors.New("leaf has key usage keyCertSign")
	}
	if leaf.KeyUsage&x509.KeyUsageCRLSign != 0 {
		return spiffeid.ID{}, errors.New("leaf has key usage cRLSign")
	}
	uris, err := rawURISANs(leaf)
	if err != nil {
		return spiffeid.ID{}, err
	}
	if len(uris) != 1 || len(leaf.URIs) != 1 {
		return spiffeid.ID{}, fmt.Errorf("leaf has %d URI SANs, want exactly 1", len(uris))
	}
	// Parse the SAN text as it is in the certificate, not crypto/x509's
	// re-serialized url.URL, and require it to round-trip: an ID that
	// only matches after normalization (case, percent-encoding, a
	// trailing slash) is not the ID that was issued.
	id, err := spiffeid.FromString(uris[0])
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("URI SAN %q: %w", uris[0], err)
	}
	if id.String() != uris[0] || leaf.URIs[0].String() != uris[0] {
		return spiffeid.ID{}, fmt.Errorf("URI SAN %q is not a canonical SPIFFE ID", uris[0])
	}
	if id.Path() == "" {
		return spiffeid.ID{}, fmt.Errorf("URI SAN %q has no path; an X509-SVID leaf names a workload", uris[0])
	}
	return id, nil
}

var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// rawURISANs returns the uniformResourceIdentifier entries of the subject
// alternative name extension exactly as encoded.
func rawURISANs(c *x509.Certificate) ([]string, error) {
	i := slices.IndexFunc(c.Extensions, func(e pkix.Extension) bool { return e.Id.Equal(oidSubjectAltName) })
	if i < 0 {
		return nil, nil
	}
	var seq asn1.RawValue
	rest, err := asn1.Unmarshal(c.Extensions[i].Value, &seq)
	if err != nil || len(rest) != 0 || !seq.IsCompound || seq.Tag != asn1.TagSequence || seq.Class != asn1.ClassUniversal {
		return nil, errors.New("malformed subject alternative name extension")
	}
	var uris []string
	for in := seq.Bytes; len(in) > 0; {
		var gn asn1.RawValue
		in, err = asn1.Unmarshal(in, &gn)
		if err != nil {
			return nil, errors.New("malformed subject alternative name extension")
		}
		const tagURI = 6 // GeneralName uniformResourceIdentifier [6] IA5String
		if gn.Class == asn1.ClassContextSpecific && gn.Tag == tagURI {
			uris = append(uris, string(gn.Bytes))
		}
	}
	return uris, nil
}
