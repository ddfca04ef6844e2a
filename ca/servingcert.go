package ca

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// renewRetry is how soon a failed renewal is tried again.
const renewRetry = 10 * time.Second

// maxServingDNSNames bounds WithDNSNames. A listener answers to a handful
// of service names; dozens point at a configuration mistake, and every name
// is sent in every handshake.
const maxServingDNSNames = 32

// maxDNSNameLen is RFC 1035 §2.3.4's 255 octets on the wire, which is 253
// characters in text form without the trailing dot.
const maxDNSNameLen = 253

// ServingCert keeps an X509-SVID for one of trustbridge's own identities
// (the https_spiffe bundle endpoint, the certificate service), signed by
// this CA and renewed at half its lifetime, for tls.Config.GetCertificate:
// rotation never needs a restart.
//
// A CA that cannot sign yet (an upstream that has not signed its first
// intermediate, a follower before the leader wrote the state) leaves it
// without a certificate: handshakes then fail, the client seeing a TLS
// internal_error alert and GetCertificate's error saying why, and the
// first handshake or CA change after the CA can sign issues one.
type ServingCert struct {
	a        *Authority
	id       spiffeid.ID
	dnsNames []string
	ttl      time.Duration
	cur      atomic.Pointer[tls.Certificate]
	// mu serializes issuance: Run's, and that of a handshake that finds
	// no certificate.
	mu sync.Mutex
	// issued tells Run that a handshake issued the first certificate, so
	// that it schedules its renewal.
	issued chan struct{}
}

// ServingCertOption configures ServingCert. The set is sealed: only this
// package provides options.
type ServingCertOption interface {
	applyServing(*servingOptions) error
}

type servingOptions struct {
	dnsNames    []string
	dnsNamesSet bool
}

type servingOptionFunc func(*servingOptions) error

func (f servingOptionFunc) applyServing(o *servingOptions) error { return f(o) }

// WithDNSNames adds DNS SANs to the serving certificate, next to its SPIFFE
// ID, for clients that verify the server by host name (Istio agents dial
// istiod.istio-system.svc). X509-SVID §2 allows an SVID any number of other
// SAN types, DNS included, so the certificate stays a valid SVID.
//
// Each name must be an RFC 1123 host name: letters, digits and hyphens in
// dot-separated labels of 1 to 63 characters, 253 characters at most, no
// trailing dot, not an IP address. Names are lowercased. Wildcards are
// refused: the certificate would then answer for every service in the zone,
// and this CA's roots are trusted by every workload of the trust domain.
// At most maxServingDNSNames, without repeats. No names is the same as not
// using the option.
//
// Workload certificates get no DNS names from their CSR (the certificate
// service refuses CSRs asking for them), and those X509SVIDParams.DNSNames
// add for them
// (--workload-dns-name-template) never include these names (see
// internal/workloaddns, reserved names): that is what makes a host name
// check for these names against this CA's roots mean "trustbridge itself".
func WithDNSNames(names ...string) ServingCertOption {
	names = append([]string(nil), names...) // the caller's slice may change
	return servingOptionFunc(func(o *servingOptions) error {
		if o.dnsNamesSet {
			return errors.New("WithDNSNames given more than once")
		}
		checked, err := checkDNSNames(names)
		if err != nil {
			return err
		}
		o.dnsNames, o.dnsNamesSet = checked, true
		return nil
	})
}

// ServingCert issues a first certificate for id, with a fresh key that
// never leaves the process, or, while the CA has nothing to sign with,
// none yet (see ServingCert). It never goes through the workload CSR
// path: there is no CSR, and the key is generated here.
func (a *Authority) ServingCert(id spiffeid.ID, ttl time.Duration, opts ...ServingCertOption) (*ServingCert, error) {
	var o servingOptions
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt.applyServing(&o); err != nil {
			return nil, fmt.Errorf("ca: serving certificate for %s: %w", id, err)
		}
	}
	s := &ServingCert{a: a, id: id, dnsNames: o.dnsNames, ttl: ttl, issued: make(chan struct{}, 1)}
	if err := a.signer.noSigningCert(); err != nil {
		a.cfg.Logger.Warn("no serving certificate yet: the CA cannot sign; TLS handshakes fail until it can, then one is issued",
			logattr.SPIFFEID, id.String(), logattr.Error, err)
		return s, nil
	}
	if err := s.renew(); err != nil {
		return nil, err
	}
	return s, nil
}

// GetCertificate serves the current certificate. Without one (the CA
// could not sign yet) it issues one if the CA can sign now, else fails
// the handshake with the reason.
func (s *ServingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.cur.Load(); c != nil {
		return c, nil
	}
	return s.first()
}

// first issues the first certificate for a handshake that found none.
// While the CA has nothing to sign with it signs nothing (no key is
// made for a refusal), so a client retrying in a loop costs little.
func (s *ServingCert) first() (*tls.Certificate, error) {
	if err := s.a.signer.noSigningCert(); err != nil {
		return nil, fmt.Errorf("ca: no serving certificate for %s yet: %w", s.id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.cur.Load(); c != nil {
		return c, nil // another handshake, or Run, issued it
	}
	if err := s.renewLocked(); err != nil {
		return nil, err
	}
	select {
	case s.issued <- struct{}{}:
	default:
	}
	return s.cur.Load(), nil
}

// Leaf is the current certificate, nil before the first (see
// ServingCert).
func (s *ServingCert) Leaf() *x509.Certificate {
	if c := s.cur.Load(); c != nil {
		return c.Leaf
	}
	return nil
}

// renew issues a new certificate now, with a new key and the same names.
// On failure the current certificate stays in service.
func (s *ServingCert) renew() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewLocked()
}

func (s *ServingCert) renewLocked() error {
	key, err := GenerateKey(KeyECP256)
	if err != nil {
		return fmt.Errorf("ca: serving certificate for %s: %w", s.id, err)
	}
	issued, err := s.a.signer.signServing(key.Public(), s.id, s.dnsNames, s.ttl)
	if err != nil {
		return fmt.Errorf("ca: serving certificate for %s: %w", s.id, err)
	}
	cert := &tls.Certificate{PrivateKey: key, Leaf: issued.Leaf}
	for _, c := range issued.Chain {
		if isRoot(c, issued.Roots) {
			continue // peers bring their own roots
		}
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	s.cur.Store(cert)
	s.a.cfg.Logger.Info("serving certificate issued", logattr.SPIFFEID, s.id.String(),
		"dns_names", s.dnsNames,
		"not_after", issued.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// signServing signs the serving certificate as Authority.SignX509SVID signs a
// workload leaf (same snapshot, clock, policy and metric), for a key
// generated in this process and with dnsNames, which only this path may add.
func (s *signer) signServing(pub crypto.PublicKey, id spiffeid.ID, dnsNames []string, ttl time.Duration) (*Issued, error) {
	return s.signWith(func(now time.Time, mat SigningMaterial, p Policy) (*Issued, error) {
		return signServing(now, mat, p, pub, id, dnsNames, ttl)
	})
}

// signServing is signX509SVID for a key of ours, and dnsNames are
// checked again here so that no caller can slip an unchecked name in.
func signServing(now time.Time, m SigningMaterial, p Policy, pub crypto.PublicKey, id spiffeid.ID, dnsNames []string, ttl time.Duration) (*Issued, error) {
	plan, err := planLeaf(now, m, p, id, ttl)
	if err != nil {
		return nil, err
	}
	if err := checkPublicKey(pub); err != nil {
		return nil, fmt.Errorf("ca: serving key: %w", err)
	}
	checked, err := checkDNSNames(dnsNames)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	return signLeaf(m, plan, pub, checked)
}

// checkDNSNames validates and lowercases the serving certificate's DNS
// names; see WithDNSNames for the rules. nil in, nil out.
func checkDNSNames(names []string) ([]string, error) {
	if len(names) > maxServingDNSNames {
		return nil, fmt.Errorf("%d DNS names, at most %d allowed", len(names), maxServingDNSNames)
	}
	return checkDNSNameList(names)
}

// checkDNSNameList is checkDNSNames without the bound on their number,
// which each kind of certificate sets itself.
func checkDNSNameList(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(names))
	seen := make(map[string]int, len(names))
	for i, n := range names {
		c, err := checkDNSName(n)
		if err != nil {
			return nil, fmt.Errorf("DNS name %d (%q): %w", i, n, err)
		}
		if j, dup := seen[c]; dup {
			return nil, fmt.Errorf("DNS name %d (%q): repeats DNS name %d", i, n, j)
		}
		seen[c] = i
		out = append(out, c)
	}
	return out, nil
}

// checkDNSName returns name lowercased if it is an RFC 1123 host name
// (RFC 5280 §4.2.1.6 preferred name syntax).
func checkDNSName(name string) (string, error) {
	if err := checkDNSNameForm(name); err != nil {
		return "", err
	}
	lower, err := lowerHostChars(name)
	if err != nil {
		return "", err
	}
	if err := checkDNSLabels(lower); err != nil {
		return "", err
	}
	return lower, nil
}

// checkDNSNameForm refuses what is not a single host name at all: an
// empty or oversized name, a wildcard, a trailing dot, an IP address.
func checkDNSNameForm(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) > maxDNSNameLen:
		return fmt.Errorf("%d characters, at most %d allowed", len(name), maxDNSNameLen)
	case strings.HasPrefix(name, "*"):
		return errors.New("wildcards are not issued; list each host name")
	case strings.HasSuffix(name, "."):
		return errors.New("trailing dot; write the name without it")
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return errors.New("an IP address, not a DNS name")
	}
	return nil
}

// lowerHostChars lowercases name, which may hold only ASCII letters,
// digits, '-' and '.'. Byte by byte and ASCII only, before lowercasing:
// strings.ToLower maps some non-ASCII letters (U+212A KELVIN SIGN) onto
// ASCII ones, which would let a look-alike through.
func lowerHostChars(name string) (string, error) {
	b := []byte(name)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '.':
		case 'A' <= c && c <= 'Z':
			b[i] = c + ('a' - 'A')
		default:
			r, _ := utf8.DecodeRuneInString(name[i:])
			return "", fmt.Errorf("character %+q at offset %d; only letters, digits, '-' and '.' are allowed", r, i)
		}
	}
	return string(b), nil
}

// checkDNSLabels checks the labels of a lowercased host name: none empty,
// none over 63 characters, none starting or ending with '-', and a last
// one that is not all digits.
func checkDNSLabels(lower string) error {
	labels := strings.Split(lower, ".")
	for _, l := range labels {
		switch {
		case l == "":
			return errors.New("empty label")
		case len(l) > 63:
			return fmt.Errorf("label %q is %d characters, at most 63 allowed", l, len(l))
		case l[0] == '-' || l[len(l)-1] == '-':
			return fmt.Errorf("label %q starts or ends with '-'", l)
		}
	}
	// RFC 3696 §2: a top-level label is never all digits; resolvers and
	// TLS stacks may take such a name for an IPv4 address ("10.1", "127.1").
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return errors.New("last label is all digits, which reads as an IP address")
	}
	return nil
}

// nextRenewal is half way through the current certificate's life; zero
// when there is none (Run then waits for the CA to change).
func (s *ServingCert) nextRenewal() time.Time {
	l := s.Leaf()
	if l == nil {
		return time.Time{}
	}
	return l.NotBefore.Add(l.NotAfter.Sub(l.NotBefore) / 2)
}

// Run renews the certificate at half its lifetime until ctx is done, and
// at once when an operator taints the authority that signed it. A failed
// renewal is retried every few seconds; the current certificate is
// served meanwhile. Without a certificate, it issues the first as soon
// as the CA can sign.
func (s *ServingCert) Run(ctx context.Context) error {
	clk := s.a.cfg.Clock
	changed := s.a.Subscribe()
	next := s.nextRenewal()
	for {
		timer, stop := wakeAt(clk, next)
		renew, done := s.await(ctx, timer, changed)
		stop()
		switch {
		case done:
			return nil
		case renew:
			next = s.renewOrRetry(clk)
		default: // a handshake issued the first certificate
			next = s.nextRenewal()
		}
	}
}

// await waits for ctx to end (done), for timer or a change of the CA
// that calls for a certificate now (renew), or for a handshake to issue
// the first certificate (neither). Other changes leave timer running.
func (s *ServingCert) await(ctx context.Context, timer <-chan time.Time, changed <-chan struct{}) (renew, done bool) {
	for {
		select {
		case <-ctx.Done():
			return false, true
		case <-timer:
			return true, false
		case <-s.issued:
			return false, false
		case <-changed:
			if s.renewOnChange() {
				return true, false
			}
		}
	}
}

// wakeAt is a timer's channel for at, and its stop; a nil channel (never
// ready) for zero.
func wakeAt(clk clock.Clock, at time.Time) (<-chan time.Time, func()) {
	if at.IsZero() {
		return nil, func() {}
	}
	t := clk.NewTimer(at.Sub(clk.Now()))
	return t.C(), func() { t.Stop() }
}

// renewOnChange says whether a change of the CA calls for a new
// certificate now: there is none and the CA can sign, or an operator
// tainted the authority that signed the current one.
func (s *ServingCert) renewOnChange() bool {
	l := s.Leaf()
	if l == nil {
		return s.a.signer.noSigningCert() == nil
	}
	if !s.a.manager.taintedIssuer(l) {
		return false
	}
	s.a.cfg.Logger.Info("serving certificate was signed by a tainted authority; re-issuing it now", logattr.SPIFFEID, s.id.String())
	return true
}

// renewOrRetry renews the certificate and returns when to renew next:
// at half its life, or renewRetry from now after a failure.
func (s *ServingCert) renewOrRetry(clk clock.PassiveClock) time.Time {
	if err := s.renew(); err != nil {
		s.a.cfg.Logger.Error("serving certificate renewal failed; retrying", logattr.SPIFFEID, s.id.String(), logattr.Error, err)
		return clk.Now().Add(renewRetry)
	}
	return s.nextRenewal()
}
