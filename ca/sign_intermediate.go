package ca

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"
)

// signIntermediate is Authority.SignIntermediate.
func (s *signer) signIntermediate(csr *x509.CertificateRequest, ttl time.Duration) (*UpstreamChain, error) {
	td := s.cfg.TrustDomain
	if err := checkCSR(csr, td.ID()); err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, csrErrorf("signature: %v", err)
	}
	if ttl < 0 {
		return nil, fmt.Errorf("ca: %w: intermediate TTL %s is negative", ErrInvalidTTL, ttl)
	}
	if ttl == 0 {
		ttl = defaultUpstreamTTL
	}
	snap, now := s.board.read(s.cfg.Clock)
	mat, err := s.material(snap)
	if err != nil {
		return nil, err
	}
	bound, certIsRoot, err := mat.check(now)
	if err != nil {
		return nil, err
	}
	if err := checkPathRoom(mat, certIsRoot); err != nil {
		return nil, err
	}
	p := snap.policy
	ttl = min(ttl, p.MaxTTL)
	if p.ClampTTL > 0 {
		ttl = min(ttl, p.ClampTTL)
	}
	notAfter := minTime(now.Add(ttl), bound)
	if notAfter.Sub(now) < minIntermediateLife {
		return nil, fmt.Errorf("ca: %w: an intermediate until %s would expire before it could sign anything; ask for at least %s", ErrInvalidTTL,
			notAfter.UTC().Format(time.RFC3339), minIntermediateLife)
	}
	cert, err := signIntermediateCert(mat, csr, now, notAfter, td.ID().URL(), td.Name(), s.cfg.downstreamDNSDomains())
	if err != nil {
		return nil, err
	}
	chain := []*x509.Certificate{cert}
	if !certIsRoot {
		chain = append(chain, mat.Cert)
	}
	chain = append(chain, mat.Intermediates...)
	return &UpstreamChain{Chain: chain, Roots: snap.bundle.X509Authorities()}, nil
}

// signIntermediateCert makes the CA certificate for csr's key.
func signIntermediateCert(m SigningMaterial, csr *x509.CertificateRequest, now, notAfter time.Time, id *url.URL, td string, dnsDomains []string) (*x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("ca: serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// A unique subject, as for roots: Go's chain builder gives up
		// after a bounded number of candidates per subject.
		Subject: pkix.Name{
			Organization: []string{td},
			CommonName:   "trustbridge downstream intermediate CA",
			SerialNumber: serial.Text(16),
		},
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		URIs:                  []*url.URL{id},
	}
	downstreamNameConstraints(tmpl, td, dnsDomains)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, m.Cert, csr.PublicKey, m.Key)
	if err != nil {
		return nil, fmt.Errorf("ca: sign intermediate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca: parse signed intermediate: %w", err)
	}
	return cert, nil
}

// Every IP address, as name constraints spell it (RFC 5280 §4.2.1.10).
var (
	everyIPv4 = &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	everyIPv6 = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
)

// downstreamDNSDomains are the DNS domains a downstream's intermediate
// may vouch for: our workload DNS zone and the operator's
// --downstream-dns-domain, without repeats.
func (c *Config) downstreamDNSDomains() []string {
	var out []string
	if c.WorkloadDNSZone != "" {
		out = append(out, c.WorkloadDNSZone)
	}
	for _, d := range c.DownstreamDNSDomains {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// downstreamNameConstraints confines what a downstream intermediate can
// vouch for to what this server itself issues: SPIFFE IDs of trust domain
// td, and DNS names only in dnsDomains, the zone of our workload DNS names
// and the operator's --downstream-dns-domain (dNSName semantics: each and
// every name below it). Without any every DNS name is excluded: a zero-length dNSName matches every name
// (RFC 5280 is silent; the CA/Browser Forum's baseline requirements,
// §7.1.2.5.2, spell "no DNS names" so, and 0.0.0.0/0 with ::/0 "no IP
// addresses"; crypto/x509 enforces both). Every IP address is excluded:
// our leaves carry none. Otherwise a leaf with only
// the DNS name payments.corp.internal under a downstream's intermediate
// would verify against our roots for any client checking a host name. The
// extension is critical (RFC 5280 §4.2.1.10: conforming CAs MUST mark it
// so), so a verifier that cannot enforce it refuses the chain instead of
// ignoring it.
func downstreamNameConstraints(tmpl *x509.Certificate, td string, dnsDomains []string) {
	tmpl.PermittedDNSDomainsCritical = true
	tmpl.PermittedURIDomains = []string{td}
	tmpl.ExcludedIPRanges = []*net.IPNet{everyIPv4, everyIPv6}
	if len(dnsDomains) > 0 {
		tmpl.PermittedDNSDomains = slices.Clone(dnsDomains)
		return
	}
	tmpl.ExcludedDNSDomains = []string{""}
}

// checkPathRoom refuses to sign an intermediate whose leaves could not
// verify: a certificate of our signing chain, or the root above it, with a
// path length constraint that leaves no room for one more CA below it.
func checkPathRoom(m SigningMaterial, certIsRoot bool) error {
	var signers []*x509.Certificate
	if !certIsRoot {
		signers = append(signers, m.Cert)
	}
	signers = append(signers, m.Intermediates...)
	top := m.Cert
	if len(signers) > 0 {
		top = signers[len(signers)-1]
	}
	for _, r := range m.Roots {
		if r.Equal(top) || top.CheckSignatureFrom(r) == nil {
			signers = append(signers, r)
			break
		}
	}
	for i, c := range signers {
		// c would have the new intermediate and i of ours below it.
		if limited := c.MaxPathLen > 0 || c.MaxPathLenZero; limited && c.MaxPathLen < i+1 {
			return fmt.Errorf("ca: %w: %s has path length %d and cannot have an intermediate %d level(s) below it; a root made for downstreams needs --downstream-allow set before it was created (rotate the root), an upstream-signed intermediate cannot sign further intermediates",
				ErrInvalidSigningMaterial, describe(c), c.MaxPathLen, i+1)
		}
	}
	return nil
}
