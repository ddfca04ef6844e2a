package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Sentinel errors, wrapped by SignX509SVID and ParseCSR so that a transport can map
// them (InvalidArgument, PermissionDenied, Unavailable) without parsing
// messages. Errors that wrap none of them are server-side faults.
var (
	// ErrInvalidCSR: the CSR is malformed, oversized, badly signed, carries
	// a weak key, or asks for names other than a SPIFFE ID.
	ErrInvalidCSR = errors.New("invalid CSR")
	// ErrIdentityNotAllowed: the proven identity cannot be issued here
	// (wrong trust domain, no path), or the CSR asks for a different one.
	ErrIdentityNotAllowed = errors.New("identity not allowed")
	// ErrInvalidTTL: the requested lifetime is negative or over the policy
	// maximum.
	ErrInvalidTTL = errors.New("invalid TTL")
	// ErrInvalidSigningMaterial: the CA certificate, key or chain cannot
	// issue a verifiable leaf right now (mismatch, not a CA, expired, no
	// path to a root). The caller's request is fine; the CA is not.
	ErrInvalidSigningMaterial = errors.New("invalid signing material")
)

// Policy limits applied when a Policy field is zero.
const (
	defaultLeafTTL    = 24 * time.Hour
	defaultMaxLeafTTL = 90 * 24 * time.Hour
)

// MaxCSRSize bounds the input to ParseCSR. A P-256 CSR is under 1 KiB and an
// RSA-8192 one under 3 KiB in PEM; the margin is for large subjects, which
// we ignore but must still read.
const MaxCSRSize = 64 << 10

// backdate is subtracted from NotBefore so that a relying party whose clock
// is a little behind ours does not reject a certificate it just received.
const backdate = 10 * time.Second

// SigningMaterial is what a CA signs with. It is passed by value on each
// call, so that rotation swaps the whole set at once and a signing never sees a
// certificate from one generation with a key from another.
type SigningMaterial struct {
	// Cert is the CA certificate that signs the leaf.
	Cert *x509.Certificate
	// Key is Cert's private key.
	Key crypto.Signer
	// Intermediates are the certificates between Cert and a root, nearest to
	// Cert first, for a plugged-in CA. They exclude Cert and the roots.
	Intermediates []*x509.Certificate
	// Roots are all the published roots a verifier needs. During rotation
	// that is more than the one Cert chains to.
	Roots []*x509.Certificate
}

// Policy is the per-trust-domain issuance policy.
type Policy struct {
	// TrustDomain is the only trust domain leaves are issued in.
	TrustDomain spiffeid.TrustDomain
	// DefaultTTL is used when a request asks for no particular lifetime.
	// Zero means 24 hours, or MaxTTL if that is shorter.
	DefaultTTL time.Duration
	// MaxTTL is the longest lifetime a request may ask for. Zero means
	// defaultMaxLeafTTL.
	MaxTTL time.Duration
	// ClampTTL, when positive, shortens every leaf to at most this
	// lifetime, whether asked for or the default, without refusing the
	// request: a bound that is the CA's business rather than the
	// client's, like the signing chain's NotAfter. Zero means none.
	ClampTTL time.Duration
}

// withDefaults fills zero fields. Its errors are configuration faults and
// deliberately wrap no sentinel: they must not reach a client as
// InvalidArgument.
func (p Policy) withDefaults() (Policy, error) {
	if p.TrustDomain.IsZero() {
		return p, errors.New("ca: policy: trust domain not set")
	}
	if p.DefaultTTL < 0 || p.MaxTTL < 0 || p.ClampTTL < 0 {
		return p, fmt.Errorf("ca: policy: negative TTL (default %s, max %s, clamp %s)", p.DefaultTTL, p.MaxTTL, p.ClampTTL)
	}
	if p.MaxTTL == 0 {
		p.MaxTTL = defaultMaxLeafTTL
	}
	if p.DefaultTTL == 0 {
		p.DefaultTTL = min(defaultLeafTTL, p.MaxTTL)
	}
	if p.DefaultTTL > p.MaxTTL {
		return p, fmt.Errorf("ca: policy: default TTL %s exceeds max TTL %s", p.DefaultTTL, p.MaxTTL)
	}
	return p, nil
}

// Issued is a signed workload certificate and what a peer needs to verify
// it.
type Issued struct {
	Leaf *x509.Certificate
	// Chain is the leaf, the signing certificate (unless it is itself a
	// root), the intermediates, then all roots: the shape of Istio's
	// CreateCertificate cert_chain.
	Chain []*x509.Certificate
	// Roots are the trailing entries of Chain.
	Roots []*x509.Certificate
}

// pemBegin starts every PEM block's first line.
const pemBegin = "-----BEGIN"

// ParseCSR parses a PKCS#10 CSR, PEM (one block, optional surrounding
// whitespace) or DER (exactly one value), and checks its self-signature and
// key strength. The subject, extensions and requested names are left for
// the caller to judge against the identity it proved, or to ignore: only
// the key is signed (X509SVIDParams.PublicKey). Every error wraps
// ErrInvalidCSR.
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	// Before any decoding, so that oversized input costs nothing.
	if len(data) > MaxCSRSize {
		return nil, csrErrorf("%d bytes exceeds the limit of %d", len(data), MaxCSRSize)
	}
	der, err := csrDER(data)
	if err != nil {
		return nil, err
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, csrErrorf("%w", err)
	}
	// Key strength first: it is cheap, and it spares us verifying a
	// signature made with a key we would refuse anyway.
	if err := checkPublicKey(csr.PublicKey); err != nil {
		return nil, csrErrorf("%w", err)
	}
	// Proof of possession. The signer relies on it having been done here.
	if err := csr.CheckSignature(); err != nil {
		return nil, csrErrorf("signature: %w", err)
	}
	return csr, nil
}

// csrDER returns the DER bytes of the one CSR in data, refusing anything
// around it but whitespace. pem.Decode alone would skip leading text and
// ignore what follows the block, so a CSR could smuggle content past us.
func csrDER(data []byte) ([]byte, error) {
	text := bytes.TrimLeft(data, " \t\r\n")
	if len(text) == 0 {
		return nil, csrErrorf("empty input")
	}
	if !bytes.HasPrefix(text, []byte(pemBegin)) {
		// DER, used as is: trimming would eat signature bytes that happen to
		// be whitespace.
		var v asn1.RawValue
		rest, err := asn1.Unmarshal(data, &v)
		if err != nil {
			return nil, csrErrorf("not PEM, and not DER: %w", err)
		}
		if len(rest) > 0 {
			return nil, csrErrorf("not PEM, and as DER: %d bytes after the first value", len(rest))
		}
		return data, nil
	}
	// Counting BEGIN lines also stops pem.Decode from skipping a malformed
	// first block and returning a later one.
	if n := bytes.Count(data, []byte(pemBegin)); n > 1 {
		return nil, csrErrorf("%d PEM blocks, want 1", n)
	}
	block, rest := pem.Decode(text)
	if block == nil {
		return nil, csrErrorf("malformed PEM block")
	}
	if !isCSRType(block.Type) {
		return nil, csrErrorf("PEM block type %q, want \"CERTIFICATE REQUEST\"", block.Type)
	}
	if len(block.Headers) > 0 {
		return nil, csrErrorf("PEM headers not allowed")
	}
	if rest = bytes.TrimSpace(rest); len(rest) > 0 {
		return nil, csrErrorf("%d bytes of trailing data after the PEM block", len(rest))
	}
	return block.Bytes, nil
}

func isCSRType(t string) bool {
	switch t {
	case "CERTIFICATE REQUEST":
		return true
	case "NEW CERTIFICATE REQUEST":
		// RFC 7468 §7: what older Netscape and Microsoft tools emit;
		// parsers may accept it, and the content is the same PKCS#10.
		return true
	}
	return false
}

// maxWorkloadDNSNames bounds the DNS names a workload leaf carries
// (X509SVIDParams.DNSNames): those an identity map gives the workload, at
// most identitymap.MaxIdentityDNSNames (32), and the one of
// --workload-dns-name-template. TestWorkloadDNSNamesBoundFitsIdentityMap
// holds the two together; more would be a bug of the caller's.
const maxWorkloadDNSNames = 33

// SignX509SVID issues an X509-SVID leaf for params.SPIFFEID, the identity
// the caller proved (never one read from a request), to params.PublicKey,
// signed by m, at time now. A request that arrives as a CSR is parsed and
// judged at the edge (ParseCSR, then the certificate service's checks of
// what it asks for); only its key reaches the signer.
//
// TTL zero means p.DefaultTTL; over p.MaxTTL is refused rather than
// clamped, so a client never silently gets less than it asked for because
// of policy. NotAfter is clamped to p.ClampTTL from now and to the signing
// chain's NotAfter, which are the CA's own business and not the client's.
//
// NotBefore is now minus 10 seconds even when that precedes the CA's own
// NotBefore: RFC 5280 does not require validity nesting, and verifiers
// check each certificate against the current time only.
//
// The leaf has an empty subject and a critical SAN extension holding the
// SPIFFE ID (RFC 5280 §4.2.1.6, as Istio does) and params.DNSNames: names
// the server derived from what the caller proved (a Kubernetes service
// account's workload DNS name, see internal/workloaddns; the names the
// server's identity map gives the pod a node agent acts for). X509-SVID §2
// allows an SVID DNS SANs next to its one URI SAN. They follow the rules of
// WithDNSNames (RFC 1123 host names, no wildcard, no IP address, no
// repeats), at most maxWorkloadDNSNames; a name that breaks them is the
// caller's code at fault, not the client's request: the error wraps no
// sentinel. A name that a DNS name constraint of m's chain refuses (an
// upstream's intermediate) is refused with ErrIdentityNotAllowed rather
// than signed into a leaf no verifier accepts. It is safe for concurrent
// use if m.Key is.
//
// params.Extensions are private extensions the caller vouches for (the
// certificate service records how the identity was first granted); see
// checkExtraExtensions for what is allowed.
func SignX509SVID(now time.Time, m SigningMaterial, p Policy, params X509SVIDParams) (*Issued, error) {
	return signX509SVID(now, m, p, params)
}

// X509SVIDParams is what an X509-SVID is signed from: a public key and
// the identity its holder proved, never names the server did not decide
// (a request may ask for names only the server's own rules give).
type X509SVIDParams struct {
	// PublicKey is the leaf's key; a weak one is refused (ErrInvalidCSR,
	// as for a CSR carrying it).
	PublicKey crypto.PublicKey
	// SPIFFEID is the identity the caller proved; it must be in the
	// policy's trust domain and have a path (ErrIdentityNotAllowed).
	SPIFFEID spiffeid.ID
	// TTL zero means the policy's default; over its maximum is refused
	// (ErrInvalidTTL). The leaf is clamped to the signing chain.
	TTL time.Duration
	// DNSNames are DNS SANs the server decided (see SignX509SVID), at
	// most maxWorkloadDNSNames.
	DNSNames []string
	// Extensions are private extensions the caller vouches for (see
	// checkExtraExtensions).
	Extensions []pkix.Extension
}

// signX509SVID is the one path every workload leaf is signed on: it
// plans the leaf (policy, material, identity, TTL), checks the caller's
// extensions, the key and the DNS names, in that order, then signs.
func signX509SVID(now time.Time, m SigningMaterial, p Policy, params X509SVIDParams) (*Issued, error) {
	id := params.SPIFFEID
	plan, err := planLeaf(now, m, p, id, params.TTL)
	if err != nil {
		return nil, err
	}
	if err := checkExtraExtensions(params.Extensions); err != nil {
		return nil, err
	}
	plan.extra = params.Extensions
	if err := checkLeafKey(params.PublicKey); err != nil {
		return nil, err
	}
	if len(params.DNSNames) > maxWorkloadDNSNames {
		return nil, fmt.Errorf("ca: %d DNS names for workload %s, at most %d", len(params.DNSNames), id, maxWorkloadDNSNames)
	}
	checked, err := checkDNSNameList(params.DNSNames)
	if err != nil {
		return nil, fmt.Errorf("ca: workload %s: %w", id, err)
	}
	if err := m.admitsDNSNames(id, checked); err != nil {
		return nil, err
	}
	return signLeaf(m, plan, params.PublicKey, checked)
}

// checkLeafKey checks X509SVIDParams.PublicKey as ParseCSR checks a
// CSR's key, with the same errors.
func checkLeafKey(pub crypto.PublicKey) error {
	if pub == nil {
		return csrErrorf("no public key")
	}
	if err := checkPublicKey(pub); err != nil {
		return csrErrorf("%w", err)
	}
	return nil
}

// leafPlan is what has been decided about a leaf before its key is looked
// at: the checked identity and the validity window.
type leafPlan struct {
	id         spiffeid.ID
	uri        *url.URL
	notBefore  time.Time
	notAfter   time.Time
	certIsRoot bool
	extra      []pkix.Extension // checked by checkExtraExtensions
}

// planLeaf applies the policy defaults, checks m, id and ttl, and clamps
// the lifetime to the signing chain, for workload leaves and the serving
// certificate alike.
func planLeaf(now time.Time, m SigningMaterial, p Policy, id spiffeid.ID, ttl time.Duration) (leafPlan, error) {
	p, err := p.withDefaults()
	if err != nil {
		return leafPlan{}, err
	}
	bound, certIsRoot, err := m.check(now)
	if err != nil {
		return leafPlan{}, err
	}
	uri, err := checkID(id, p.TrustDomain)
	if err != nil {
		return leafPlan{}, err
	}
	switch {
	case ttl < 0:
		return leafPlan{}, fmt.Errorf("ca: %w: %s is negative", ErrInvalidTTL, ttl)
	case ttl > p.MaxTTL:
		return leafPlan{}, fmt.Errorf("ca: %w: %s exceeds the maximum of %s", ErrInvalidTTL, ttl, p.MaxTTL)
	case ttl == 0:
		ttl = p.DefaultTTL
	}
	if p.ClampTTL > 0 {
		ttl = min(ttl, p.ClampTTL)
	}
	notAfter := now.Add(ttl)
	if notAfter.After(bound) {
		notAfter = bound
	}
	return leafPlan{id: id, uri: uri, notBefore: now.Add(-backdate), notAfter: notAfter, certIsRoot: certIsRoot}, nil
}

// signLeaf signs the leaf planned for pub, which the caller has checked
// (checkPublicKey), with dnsNames that checkDNSNames accepted: the
// serving certificate's, or a workload's X509SVIDParams.DNSNames.
func signLeaf(m SigningMaterial, plan leafPlan, pub crypto.PublicKey, dnsNames []string) (*Issued, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("ca: serial number: %w", err)
	}
	skid, err := subjectKeyID(pub)
	if err != nil {
		return nil, fmt.Errorf("ca: %w: %w", ErrInvalidCSR, err)
	}
	usage := x509.KeyUsageDigitalSignature
	if _, ok := pub.(*rsa.PublicKey); ok {
		// TLS 1.2 RSA key exchange encrypts to the leaf key; EC and Ed25519
		// keys cannot encrypt, so the bit would be a false statement there.
		usage |= x509.KeyUsageKeyEncipherment
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    plan.notBefore,
		NotAfter:     plan.notAfter,
		KeyUsage:     usage,
		// X509-SVID §4.4: when present, both purposes must be set.
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{plan.uri},
		// X509-SVID §2: an SVID may carry other SAN types, DNS included,
		// next to its one URI SAN.
		DNSNames: dnsNames,
		// Go derives a SubjectKeyId only for CA templates; peers building
		// chains and operators matching keys both benefit from one.
		SubjectKeyId: skid,
		// Subject is left empty; CreateCertificate then marks the SAN
		// extension critical, as RFC 5280 §4.2.1.6 requires.
		ExtraExtensions: plan.extra,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, m.Cert, pub, m.Key)
	if err != nil {
		return nil, fmt.Errorf("ca: sign leaf for %q: %w", plan.id, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca: parse signed leaf for %q: %w", plan.id, err)
	}

	n := 1 + len(m.Intermediates) + len(m.Roots)
	if !plan.certIsRoot {
		n++
	}
	chain := make([]*x509.Certificate, 0, n)
	chain = append(chain, leaf)
	if !plan.certIsRoot {
		chain = append(chain, m.Cert)
	}
	chain = append(chain, m.Intermediates...)
	chain = append(chain, m.Roots...)
	return &Issued{Leaf: leaf, Chain: chain, Roots: chain[n-len(m.Roots) : n : n]}, nil
}

// check makes sure m can issue a leaf that verifies at now, and returns the
// latest NotAfter such a leaf may have: the earliest NotAfter along the path
// from m.Cert to its root. It links the path by names only; verifying every
// signature on each call would cost more than signing the leaf, and the
// material was verified when it was loaded.
func (m SigningMaterial) check(now time.Time) (bound time.Time, certIsRoot bool, err error) {
	if err := m.checkSigner(); err != nil {
		return bound, false, err
	}
	certIsRoot = isRoot(m.Cert, m.Roots)
	if certIsRoot && len(m.Intermediates) > 0 {
		return bound, false, materialErrorf("certificate %s is a root but has %d intermediates", describe(m.Cert), len(m.Intermediates))
	}
	if err := checkValidAt(m.Cert, now); err != nil {
		return bound, false, err
	}
	bound, top, err := m.intermediatesBound(now)
	if err != nil {
		return bound, false, err
	}
	if certIsRoot {
		return bound, true, nil
	}
	rootNotAfter, err := m.rootBound(now, top)
	if err != nil {
		return bound, false, err
	}
	return minTime(bound, rootNotAfter), false, nil
}

// checkSigner checks the signing certificate and key on their own: present,
// matching, a CA asserting keyCertSign, with roots to chain to.
func (m SigningMaterial) checkSigner() error {
	if m.Cert == nil {
		return materialErrorf("no signing certificate")
	}
	if m.Key == nil {
		return materialErrorf("no signing key")
	}
	pub, ok := m.Key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(m.Cert.PublicKey) {
		return materialErrorf("signing key does not match certificate %s", describe(m.Cert))
	}
	if !m.Cert.BasicConstraintsValid || !m.Cert.IsCA {
		return materialErrorf("certificate %s is not a CA", describe(m.Cert))
	}
	// X509-SVID §4.3: signing certificates must assert keyCertSign; an
	// absent keyUsage extension is not enough here.
	if m.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return materialErrorf("certificate %s lacks keyCertSign", describe(m.Cert))
	}
	if len(m.Roots) == 0 {
		return materialErrorf("no roots")
	}
	for i, r := range m.Roots {
		if r == nil {
			return materialErrorf("root %d is nil", i)
		}
	}
	return nil
}

// intermediatesBound walks from m.Cert up the intermediates, each of which
// must have issued the one below it and be a valid CA at now, and returns
// the earliest NotAfter on the way and the topmost certificate.
func (m SigningMaterial) intermediatesBound(now time.Time) (bound time.Time, top *x509.Certificate, err error) {
	bound, top = m.Cert.NotAfter, m.Cert
	for i, c := range m.Intermediates {
		switch {
		case c == nil:
			return bound, nil, materialErrorf("intermediate %d is nil", i)
		case isRoot(c, m.Roots):
			return bound, nil, materialErrorf("intermediate %d %s is a root; list it only in Roots", i, describe(c))
		case !bytes.Equal(top.RawIssuer, c.RawSubject):
			return bound, nil, materialErrorf("intermediate %d %s did not issue %s (issuer %q)", i, describe(c), describe(top), top.Issuer)
		case !c.BasicConstraintsValid || !c.IsCA:
			return bound, nil, materialErrorf("intermediate %d %s is not a CA", i, describe(c))
		case c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0:
			return bound, nil, materialErrorf("intermediate %d %s lacks keyCertSign", i, describe(c))
		}
		if err := checkValidAt(c, now); err != nil {
			return bound, nil, err
		}
		bound = minTime(bound, c.NotAfter)
		top = c
	}
	return bound, top, nil
}

// rootBound is the latest NotAfter among the roots valid at now that issued
// top. Several roots can match during rotation or cross-signing; any one of
// them completes a chain, so the latest-expiring one bounds the leaf. Roots
// that have nothing to do with this chain must not bound it.
func (m SigningMaterial) rootBound(now time.Time, top *x509.Certificate) (time.Time, error) {
	var rootNotAfter time.Time
	for _, r := range m.Roots {
		if !bytes.Equal(r.RawSubject, top.RawIssuer) ||
			(len(top.AuthorityKeyId) > 0 && len(r.SubjectKeyId) > 0 && !bytes.Equal(top.AuthorityKeyId, r.SubjectKeyId)) ||
			now.Before(r.NotBefore) || now.After(r.NotAfter) {
			continue
		}
		if r.NotAfter.After(rootNotAfter) {
			rootNotAfter = r.NotAfter
		}
	}
	if rootNotAfter.IsZero() {
		return rootNotAfter, materialErrorf("no valid root among %d issued %s (issuer %q)", len(m.Roots), describe(top), top.Issuer)
	}
	return rootNotAfter, nil
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func isRoot(c *x509.Certificate, roots []*x509.Certificate) bool {
	for _, r := range roots {
		if r == c || bytes.Equal(r.Raw, c.Raw) {
			return true
		}
	}
	return false
}

func checkValidAt(c *x509.Certificate, now time.Time) error {
	if now.Before(c.NotBefore) {
		return materialErrorf("certificate %s is not valid before %s", describe(c), c.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(c.NotAfter) {
		return materialErrorf("certificate %s expired at %s", describe(c), c.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// describe names a certificate in errors the way an operator finds it:
// subject and serial.
func describe(c *x509.Certificate) string {
	return fmt.Sprintf("%q (serial %s)", c.Subject.String(), c.SerialNumber)
}

// checkID refuses identities this CA must not certify and returns the URI
// for the SAN. go-spiffe only builds canonical IDs today; the round trip
// guards the SAN against a future constructor that does not.
func checkID(id spiffeid.ID, td spiffeid.TrustDomain) (*url.URL, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("ca: %w: empty SPIFFE ID", ErrIdentityNotAllowed)
	}
	s := id.String()
	uri := id.URL()
	if back, err := spiffeid.FromString(s); err != nil || back != id || uri.String() != s {
		return nil, fmt.Errorf("ca: %w: SPIFFE ID %q is not canonical", ErrIdentityNotAllowed, s)
	}
	if !id.MemberOf(td) {
		return nil, fmt.Errorf("ca: %w: %q is not in trust domain %q", ErrIdentityNotAllowed, s, td)
	}
	// X509-SVID §2: a leaf names a workload, and the bare trust domain ID
	// names the trust domain itself.
	if id.Path() == "" {
		return nil, fmt.Errorf("ca: %w: %q has no path", ErrIdentityNotAllowed, s)
	}
	return uri, nil
}

// checkCSR judges what a CSR asks for against the proven id: the
// intermediate path's edge (SignIntermediate).
func checkCSR(csr *x509.CertificateRequest, id spiffeid.ID) error {
	if csr == nil {
		return csrErrorf("no CSR")
	}
	if err := checkPublicKey(csr.PublicKey); err != nil {
		return csrErrorf("%w", err)
	}
	// We vouch only for the SPIFFE ID. Silently dropping other names would
	// hand the workload a certificate that differs from what it asked for.
	switch {
	case len(csr.DNSNames) > 0:
		return csrErrorf("DNS SANs %q requested; only a SPIFFE ID is issued", csr.DNSNames)
	case len(csr.IPAddresses) > 0:
		return csrErrorf("IP SANs %v requested; only a SPIFFE ID is issued", csr.IPAddresses)
	case len(csr.EmailAddresses) > 0:
		return csrErrorf("email SANs %q requested; only a SPIFFE ID is issued", csr.EmailAddresses)
	case len(csr.URIs) > 1:
		return fmt.Errorf("ca: %w: CSR requests %d URI SANs, want at most 1", ErrIdentityNotAllowed, len(csr.URIs))
	case len(csr.URIs) == 1:
		// String comparison, not spiffeid parsing: a SAN that only parses to
		// id after normalisation is still a request for something else.
		if u := csr.URIs[0]; u == nil || u.String() != id.String() {
			return fmt.Errorf("ca: %w: CSR requests URI SAN %q, but the caller proved %q", ErrIdentityNotAllowed, uriString(u), id)
		}
	}
	return nil
}

func uriString(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.String()
}

// newSerial returns a random positive 128-bit serial number: unpredictable
// (CA/B BR §7.1 asks for 64 bits of entropy) and at most 17 octets in DER,
// within RFC 5280's 20.
func newSerial() (*big.Int, error) {
	var b [16]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		if n := new(big.Int).SetBytes(b[:]); n.Sign() > 0 {
			return n, nil
		}
	}
}

// subjectKeyID derives the key identifier the way Go does for CA
// certificates (RFC 7093 §2 method 1: leftmost 160 bits of the SHA-256 of
// the subjectPublicKey BIT STRING), so that leaf and CA identifiers agree in
// kind. The BIT STRING contents are built per key type, as x509 encodes
// them, rather than by marshalling and re-parsing a whole SPKI: that round
// trip was a measurable part of signing's cost.
func subjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	var bits []byte
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		b, err := k.Bytes()
		if err != nil {
			return nil, err
		}
		bits = b
	case *rsa.PublicKey:
		bits = x509.MarshalPKCS1PublicKey(k)
	case ed25519.PublicKey:
		bits = k
	default:
		return nil, fmt.Errorf("key type %T not allowed", pub)
	}
	sum := sha256.Sum256(bits)
	return sum[:20], nil
}

// Limits on a leaf's extra extensions (X509SVIDParams.Extensions).
const (
	maxExtraExtensions    = 4
	maxExtraExtensionSize = 2 << 10
)

// privateEnterpriseArc is 1.3.6.1.4.1, under which organisations define
// their own extensions.
var privateEnterpriseArc = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1}

// checkExtraExtensions keeps a leaf's extra extensions to what they are for:
// a few small, non-critical private extensions. x509.CreateCertificate
// lets an extra extension replace one it builds from the template (the
// SAN, key usages, basic constraints), and a critical one would make
// every verifier that does not know it reject the leaf; both are refused.
// A fault here is the caller's code, not the client's request, so the
// error wraps no sentinel.
func checkExtraExtensions(extra []pkix.Extension) error {
	if len(extra) > maxExtraExtensions {
		return fmt.Errorf("ca: %d extra extensions, at most %d", len(extra), maxExtraExtensions)
	}
	for i, e := range extra {
		switch {
		case e.Critical:
			return fmt.Errorf("ca: extra extension %s is critical", e.Id)
		case len(e.Id) <= len(privateEnterpriseArc) || !slices.Equal(e.Id[:len(privateEnterpriseArc)], privateEnterpriseArc):
			return fmt.Errorf("ca: extra extension %s is not under the private enterprise arc %s", e.Id, privateEnterpriseArc)
		case len(e.Value) > maxExtraExtensionSize:
			return fmt.Errorf("ca: extra extension %s is %d bytes, more than %d", e.Id, len(e.Value), maxExtraExtensionSize)
		}
		for _, prev := range extra[:i] {
			if prev.Id.Equal(e.Id) {
				return fmt.Errorf("ca: extra extension %s repeats", e.Id)
			}
		}
	}
	return nil
}

func csrErrorf(format string, args ...any) error {
	return fmt.Errorf("ca: %w: "+format, append([]any{ErrInvalidCSR}, args...)...)
}

func materialErrorf(format string, args ...any) error {
	return fmt.Errorf("ca: %w: "+format, append([]any{ErrInvalidSigningMaterial}, args...)...)
}
