package ca

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// Bounds on what an upstream may return and what the journal may record
// for one intermediate: a real chain has two or three certificates.
const (
	maxUpstreamCerts = 8
	maxUpstreamBytes = 64 << 10
	// maxIntermediateLife refuses an intermediate whose issuer handed out
	// a lifetime no rotation plan can cover.
	maxIntermediateLife = 10 * 365 * 24 * time.Hour
	// minIntermediateLife refuses one that would expire before it could
	// sign anything useful.
	minIntermediateLife = 2 * time.Minute
)

// ErrInvalidUpstreamChain marks an upstream answer that was refused.
var ErrInvalidUpstreamChain = errors.New("invalid upstream chain")

// upstreamName names an upstream for messages.
func upstreamName(u UpstreamAuthority) string {
	if s, ok := u.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("upstream %T", u)
}

func upstreamErrorf(name, format string, args ...any) error {
	return fmt.Errorf("ca: upstream %s: %w: %s", name, ErrInvalidUpstreamChain, fmt.Sprintf(format, args...))
}

// CheckUpstreamChain checks an upstream's answer to a request for an
// intermediate of trust domain td made with key pub, at now, before it is
// stored or used: nothing an upstream returns is trusted as is. upstream
// names it in errors. The first certificate must be for pub, a CA allowed
// to sign certificates, carrying no identity but td's SPIFFE ID (X509-SVID
// §4), valid now; the whole chain must verify to one of the returned
// roots, each a CA.
func CheckUpstreamChain(now time.Time, td spiffeid.TrustDomain, pub crypto.PublicKey, upstream string, c *UpstreamChain) error {
	if err := checkUpstreamShape(upstream, c); err != nil {
		return err
	}
	if err := checkIntermediateCert(now, td, pub, upstream, c.Chain[0]); err != nil {
		return err
	}
	return verifyUpstreamChain(now, upstream, c)
}

func checkUpstreamShape(upstream string, c *UpstreamChain) error {
	if c == nil || len(c.Chain) == 0 {
		return upstreamErrorf(upstream, "returned no certificate")
	}
	if len(c.Roots) == 0 {
		return upstreamErrorf(upstream, "returned no root to verify the chain to")
	}
	if n := len(c.Chain) + len(c.Roots); n > maxUpstreamCerts {
		return upstreamErrorf(upstream, "returned %d certificates, at most %d are accepted", n, maxUpstreamCerts)
	}
	size := 0
	roots := map[string]bool{}
	for i, r := range c.Roots {
		if r == nil {
			return upstreamErrorf(upstream, "root %d is missing", i)
		}
		if !r.BasicConstraintsValid || !r.IsCA {
			return upstreamErrorf(upstream, "root %d %s is not a CA certificate", i, describe(r))
		}
		roots[fingerprint(r)] = true
		size += len(r.Raw)
	}
	for i, cert := range c.Chain {
		if cert == nil {
			return upstreamErrorf(upstream, "chain certificate %d is missing", i)
		}
		if roots[fingerprint(cert)] {
			return upstreamErrorf(upstream, "chain certificate %d %s is one of the roots; the chain must stop below them", i, describe(cert))
		}
		size += len(cert.Raw)
	}
	if size > maxUpstreamBytes {
		return upstreamErrorf(upstream, "returned %d bytes of certificates, at most %d are accepted", size, maxUpstreamBytes)
	}
	return nil
}

// checkIntermediateCert checks the certificate signed for our request:
// what it is for, then when.
func checkIntermediateCert(now time.Time, td spiffeid.TrustDomain, pub crypto.PublicKey, upstream string, c *x509.Certificate) error {
	if err := checkIntermediateRole(td, pub, upstream, c); err != nil {
		return err
	}
	return checkIntermediateValidity(now, upstream, c)
}

// checkIntermediateRole checks that c certifies our key as a signing
// certificate of td: a CA asserting keyCertSign that names nothing but
// td's ID.
func checkIntermediateRole(td spiffeid.TrustDomain, pub crypto.PublicKey, upstream string, c *x509.Certificate) error {
	switch {
	case !publicKeysMatch(pub, c.PublicKey):
		return upstreamErrorf(upstream, "certificate %s is not for the key of our request", describe(c))
	case !c.BasicConstraintsValid || !c.IsCA:
		return upstreamErrorf(upstream, "certificate %s is not a CA certificate; ask it for a signing (CA) certificate", describe(c))
	case c.KeyUsage&x509.KeyUsageCertSign == 0:
		return upstreamErrorf(upstream, "certificate %s lacks the keyCertSign key usage", describe(c))
	case len(c.DNSNames)+len(c.EmailAddresses)+len(c.IPAddresses) > 0:
		return upstreamErrorf(upstream, "certificate %s carries DNS, email or IP names; a signing certificate carries none", describe(c))
	case len(c.URIs) > 1 || len(c.URIs) == 1 && c.URIs[0].String() != td.ID().String():
		return upstreamErrorf(upstream, "certificate %s names %v; a signing certificate of %s may name only %s", describe(c), c.URIs, td, td.ID())
	}
	return nil
}

// checkIntermediateValidity checks c's validity: current at now, with
// enough life left to sign anything, not implausibly long, and a serial
// number the state can name it by.
func checkIntermediateValidity(now time.Time, upstream string, c *x509.Certificate) error {
	switch {
	case now.Before(c.NotBefore) || now.After(c.NotAfter):
		return upstreamErrorf(upstream, "certificate %s is not valid now (%s to %s)", describe(c),
			c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
	case c.NotAfter.Sub(now) < minIntermediateLife:
		return upstreamErrorf(upstream, "certificate %s expires at %s, too soon to sign anything", describe(c), c.NotAfter.UTC().Format(time.RFC3339))
	case c.NotAfter.Sub(c.NotBefore) > maxIntermediateLife:
		return upstreamErrorf(upstream, "certificate %s is valid for %s, more than the %s accepted", describe(c), c.NotAfter.Sub(c.NotBefore), maxIntermediateLife)
	case c.SerialNumber == nil || c.SerialNumber.Sign() <= 0 || !castate.SafeID(c.SerialNumber.Text(16)):
		return upstreamErrorf(upstream, "certificate %s has a serial number that is not positive or longer than 32 bytes", describe(c))
	}
	return nil
}

// verifyUpstreamChain checks that the chain, in the order given, verifies
// to one of the returned roots.
func verifyUpstreamChain(now time.Time, upstream string, c *UpstreamChain) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range c.Roots {
		roots.AddCert(r)
	}
	for _, i := range c.Chain[1:] {
		inter.AddCert(i)
	}
	chains, err := c.Chain[0].Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return upstreamErrorf(upstream, "chain does not verify to the roots it returned: %v", err)
	}
	for _, ch := range chains {
		if len(ch) == len(c.Chain)+1 && samePrefix(ch, c.Chain) {
			return nil
		}
	}
	return upstreamErrorf(upstream, "chain of %d certificates is out of order or holds certificates the path does not use", len(c.Chain))
}

func samePrefix(path, chain []*x509.Certificate) bool {
	for i, c := range chain {
		if !path[i].Equal(c) {
			return false
		}
	}
	return true
}

// upstreamRecord is the journal record of a checked upstream answer.
func upstreamRecord(name string, at time.Time, c *UpstreamChain) *castate.UpstreamRecord {
	rec := &castate.UpstreamRecord{Name: name, ObtainedAt: at}
	for _, i := range c.Chain[1:] {
		rec.Chain = append(rec.Chain, i.Raw)
	}
	for _, r := range c.Roots {
		rec.Roots = append(rec.Roots, r.Raw)
	}
	return rec
}
