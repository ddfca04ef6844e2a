package ca

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
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

// UpstreamRecord is what the journal keeps about an intermediate an
// upstream signed (RootRecord.Upstream): the certificates above it, so
// that every replica signs and publishes the same thing.
type UpstreamRecord struct {
	// Name is the upstream, as its String() named it.
	Name string `json:"name"`
	// ObtainedAt is when the upstream signed it.
	ObtainedAt time.Time `json:"obtained_at"`
	// Chain is the DER of the upstream's intermediates above ours, nearest
	// first, excluding roots.
	Chain [][]byte `json:"chain,omitempty"`
	// Roots is the DER of the upstream roots the chain verifies to; they
	// are what the bundle publishes.
	Roots [][]byte `json:"roots"`
}

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

// checkIntermediateCert checks the certificate signed for our request.
func checkIntermediateCert(now time.Time, td spiffeid.TrustDomain, pub crypto.PublicKey, upstream string, c *x509.Certificate) error {
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
	case now.Before(c.NotBefore) || now.After(c.NotAfter):
		return upstreamErrorf(upstream, "certificate %s is not valid now (%s to %s)", describe(c),
			c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
	case c.NotAfter.Sub(now) < minIntermediateLife:
		return upstreamErrorf(upstream, "certificate %s expires at %s, too soon to sign anything", describe(c), c.NotAfter.UTC().Format(time.RFC3339))
	case c.NotAfter.Sub(c.NotBefore) > maxIntermediateLife:
		return upstreamErrorf(upstream, "certificate %s is valid for %s, more than the %s accepted", describe(c), c.NotAfter.Sub(c.NotBefore), maxIntermediateLife)
	case c.SerialNumber == nil || c.SerialNumber.Sign() <= 0 || !safeRootID(c.SerialNumber.Text(16)):
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
func upstreamRecord(name string, at time.Time, c *UpstreamChain) *UpstreamRecord {
	rec := &UpstreamRecord{Name: name, ObtainedAt: at}
	for _, i := range c.Chain[1:] {
		rec.Chain = append(rec.Chain, i.Raw)
	}
	for _, r := range c.Roots {
		rec.Roots = append(rec.Roots, r.Raw)
	}
	return rec
}

// decodeUpstreamRecord parses an intermediate's journal record and checks
// that cert, the intermediate, chains through it to one of its roots by
// signature (not by time: a retired intermediate may have expired).
func decodeUpstreamRecord(id string, cert *x509.Certificate, rec *UpstreamRecord) (chain, roots []*x509.Certificate, err error) {
	if len(rec.Roots) == 0 || 1+len(rec.Chain)+len(rec.Roots) > maxUpstreamCerts {
		return nil, nil, corrupt("intermediate %s: upstream record has %d chain certificates and %d roots; want at least one root and at most %d in all",
			id, len(rec.Chain), len(rec.Roots), maxUpstreamCerts)
	}
	if chain, err = parseDERs(id, "chain", rec.Chain); err != nil {
		return nil, nil, err
	}
	if roots, err = parseDERs(id, "root", rec.Roots); err != nil {
		return nil, nil, err
	}
	for _, r := range roots {
		if !r.BasicConstraintsValid || !r.IsCA {
			return nil, nil, corrupt("intermediate %s: upstream root %s is not a CA", id, describe(r))
		}
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, nil, corrupt("intermediate %s: certificate is not a CA", id)
	}
	top := cert
	for _, c := range chain {
		if err := top.CheckSignatureFrom(c); err != nil {
			return nil, nil, corrupt("intermediate %s: %s did not sign %s: %v", id, describe(c), describe(top), err)
		}
		top = c
	}
	for _, r := range roots {
		if top.CheckSignatureFrom(r) == nil {
			return chain, roots, nil
		}
	}
	return nil, nil, corrupt("intermediate %s: no recorded upstream root signed %s", id, describe(top))
}

func parseDERs(id, what string, ders [][]byte) ([]*x509.Certificate, error) {
	size := 0
	out := make([]*x509.Certificate, 0, len(ders))
	for i, der := range ders {
		size += len(der)
		if size > maxUpstreamBytes {
			return nil, corrupt("intermediate %s: upstream record is larger than %d bytes", id, maxUpstreamBytes)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, corrupt("intermediate %s: upstream %s %d: %v", id, what, i, err)
		}
		out = append(out, c)
	}
	return out, nil
}
