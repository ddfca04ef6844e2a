package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/internal/svidcheck"
)

// Verifier authenticates X509-SVID peers against the roots of each peer's
// own trust domain and then authorizes them with a go-spiffe
// tlsconfig.Authorizer (tlsconfig.AuthorizeMemberOf, AuthorizeID,
// AuthorizeOneOf, AuthorizeAny, or any function of that type). Authorizer
// nil rejects every peer, so a forgotten field fails closed.
//
// The chain check is internal/svidcheck's, the one trustbridge uses
// everywhere: go-spiffe's x509svid.Verify, after a stricter leaf check
// (the URI SAN must be a canonical SPIFFE ID as encoded, with a path) and
// with the extended key usage checked along the chain.
type Verifier struct {
	// Bundles supplies the roots; only the bundle of the leaf's own trust
	// domain is asked for, on every call. A *Store answers from its
	// snapshot of that moment, so a root removed from the store stops
	// being accepted at once. A single *x509bundle.Bundle or an
	// x509bundle.Set serve as well.
	Bundles    x509bundle.Source
	Authorizer tlsconfig.Authorizer
	// Now returns the time chains are verified at; nil means time.Now.
	Now func() time.Time
}

// Errors callers may want to tell apart; every error from the Verifier
// wraps one of them. The chain check's errors are internal/svidcheck's
// own, so errors.Is holds across both.
var (
	ErrNotSVID         = svidcheck.ErrNotSVID
	ErrUnknownDomain   = svidcheck.ErrUnknownDomain
	ErrChain           = svidcheck.ErrChain
	ErrNoPeerCertChain = svidcheck.ErrNoCertificate
	ErrUnauthorized    = errors.New("peer is not authorized")
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
	return v.VerifyCertificates(certs, x509.ExtKeyUsageAny)
}

// VerifyCertificates is VerifyPeer for parsed certificates, checking the
// chain for usage (x509.ExtKeyUsageClientAuth on a server,
// x509.ExtKeyUsageServerAuth on a client, x509.ExtKeyUsageAny otherwise).
func (v *Verifier) VerifyCertificates(certs []*x509.Certificate, usage x509.ExtKeyUsage) (spiffeid.ID, error) {
	if v == nil || v.Bundles == nil {
		return spiffeid.ID{}, errors.New("trust: verifier has no bundle source")
	}
	var opts []x509svid.VerifyOption
	if v.Now != nil {
		opts = append(opts, x509svid.WithTime(v.Now()))
	}
	id, chains, err := svidcheck.Verify(certs, v.Bundles, usage, opts...)
	switch {
	case err != nil && id.IsZero():
		return id, fmt.Errorf("trust: %w", err)
	case err != nil:
		return id, fmt.Errorf("trust: peer %q: %w", id, err)
	case v.Authorizer == nil:
		return id, fmt.Errorf("trust: peer %q: %w: no authorizer configured", id, ErrUnauthorized)
	}
	if err := v.Authorizer(id, chains); err != nil {
		return id, fmt.Errorf("trust: peer %q: %w: %w", id, ErrUnauthorized, err)
	}
	return id, nil
}
