package trust

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Authorizer decides whether an authenticated peer ID may proceed. It runs
// only after the peer's chain verified against its own trust domain's roots.
type Authorizer func(id spiffeid.ID) error

// AuthorizeAny accepts every verified peer.
func AuthorizeAny() Authorizer {
	return func(spiffeid.ID) error { return nil }
}

// AuthorizeID accepts exactly want.
func AuthorizeID(want spiffeid.ID) Authorizer {
	return func(id spiffeid.ID) error {
		if id != want {
			return fmt.Errorf("peer %q is not %q", id, want)
		}
		return nil
	}
}

// AuthorizeOneOf accepts any of ids.
func AuthorizeOneOf(ids ...spiffeid.ID) Authorizer {
	set := make(map[spiffeid.ID]struct{}, len(ids))
	for _, id := range ids {
		set[id] = struct{}{}
	}
	return func(id spiffeid.ID) error {
		if _, ok := set[id]; !ok {
			return fmt.Errorf("peer %q is not one of the %d authorized IDs", id, len(set))
		}
		return nil
	}
}

// AuthorizeMemberOf accepts any ID in td.
func AuthorizeMemberOf(td spiffeid.TrustDomain) Authorizer {
	return func(id spiffeid.ID) error {
		if !id.MemberOf(td) {
			return fmt.Errorf("peer %q is not a member of trust domain %q", id, td)
		}
		return nil
	}
}

// Verifier authenticates X509-SVID peers against the store's current
// snapshot and then authorizes them. Authorizer nil rejects every peer, so
// a forgotten field fails closed.
type Verifier struct {
	Store      *Store
	Authorizer Authorizer
	// Now returns the time chains are verified at; nil means time.Now.
	Now func() time.Time
}

// Errors callers may want to tell apart; every error from VerifyPeer wraps
// one of them.
var (
	ErrNotSVID         = errors.New("peer certificate is not a valid X509-SVID leaf")
	ErrUnknownDomain   = errors.New("no bundle for the peer's trust domain")
	ErrChain           = errors.New("peer chain does not verify against its trust domain's roots")
	ErrUnauthorized    = errors.New("peer is not authorized")
	ErrNoPeerCertChain = errors.New("peer presented no certificate")
)

// VerifyPeer verifies a peer chain (leaf first, as crypto/tls passes it)
// for any extended key usage and returns the peer's SPIFFE ID.
func (v *Verifier) VerifyPeer(rawCerts [][]byte) (spiffeid.ID, error) {
	certs := make([]*x509.Certificate, 0, len(rawCerts))
	for i, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return spiffeid.ID{}, fmt.Errorf("trust: peer certificate %d: %w: %w", i, ErrNotSVID, err)
		}
		certs = append(certs, c)
	}
	return v.verify(certs, x509.ExtKeyUsageAny)
}

// VerifyCertificates is VerifyPeer for parsed certificates, checking the
// leaf for usage (x509.ExtKeyUsageClientAuth on a server,
// x509.ExtKeyUsageServerAuth on a client, x509.ExtKeyUsageAny otherwise).
func (v *Verifier) VerifyCertificates(certs []*x509.Certificate, usage x509.ExtKeyUsage) (spiffeid.ID, error) {
	return v.verify(certs, usage)
}

func (v *Verifier) verify(certs []*x509.Certificate, usage x509.ExtKeyUsage) (spiffeid.ID, error) {
	if v == nil || v.Store == nil {
		return spiffeid.ID{}, errors.New("trust: verifier has no store")
	}
	if len(certs) == 0 {
		return spiffeid.ID{}, fmt.Errorf("trust: %w", ErrNoPeerCertChain)
	}
	leaf := certs[0]
	id, err := leafID(leaf)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("trust: %w: %w", ErrNotSVID, err)
	}
	// Only the roots of the ID's own trust domain: a root of another
	// trust domain, even one we federate with, must not vouch for it.
	roots, ok := v.Store.Snapshot().Roots(id.TrustDomain())
	if !ok {
		return id, fmt.Errorf("trust: peer %q: %w %q", id, ErrUnknownDomain, id.TrustDomain())
	}
	opts := x509.VerifyOptions{
		Roots:     roots,
		KeyUsages: []x509.ExtKeyUsage{usage},
	}
	if v.Now != nil {
		opts.CurrentTime = v.Now()
	}
	if len(certs) > 1 {
		opts.Intermediates = x509.NewCertPool()
		for _, c := range certs[1:] {
			opts.Intermediates.AddCert(c)
		}
	}
	if _, err := leaf.Verify(opts); err != nil {
		return id, fmt.Errorf("trust: peer %q: %w: %w", id, ErrChain, err)
	}
	if v.Authorizer == nil {
		return id, fmt.Errorf("trust: peer %q: %w: no authorizer configured", id, ErrUnauthorized)
	}
	if err := v.Authorizer(id); err != nil {
		return id, fmt.Errorf("trust: %w: %w", ErrUnauthorized, err)
	}
	return id, nil
}

// leafID applies the X509-SVID leaf rules and returns the leaf's SPIFFE ID.
func leafID(leaf *x509.Certificate) (spiffeid.ID, error) {
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
