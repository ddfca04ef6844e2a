package bundleserver

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/mail"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
	"golang.org/x/net/idna"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// acmeHTTPTimeout bounds each request to the ACME directory; autocert
// bounds a whole issuance at five minutes, which one stuck connection
// should not use up.
const acmeHTTPTimeout = 30 * time.Second

// ACMEConfig configures ACME certificates for the https_web profile.
type ACMEConfig struct {
	// Domains are the host names to obtain certificates for; at least one.
	// Handshakes for any other name are refused before ACME is contacted,
	// so scanners cannot spend the CA's rate limits.
	Domains []string
	// Email is the optional account contact for the CA's notices.
	Email string
	// DirectoryURL is the ACME directory; default Let's Encrypt production
	// (acme.LetsEncryptURL).
	DirectoryURL string
	// TOSAccepted records that the operator accepted the CA's terms of
	// service; it must be true.
	TOSAccepted bool
	// CacheDir keeps the account key and certificates across restarts
	// (without it every restart would order anew and soon hit the CA's rate
	// limits). Required; created 0700, and tightened to 0700 if looser.
	CacheDir string
	// RootCAs verifies the ACME directory's HTTPS certificate; nil means
	// the system roots.
	RootCAs *x509.CertPool
}

// ACME serves the https_web profile's certificate from an ACME CA (Let's
// Encrypt by default), obtained on the first handshake for a configured
// name and renewed in the background by autocert. Domain validation uses
// TLS-ALPN-01 on the serving port itself, so the listener's NextProtos
// must include acme.ALPNProto (TLSConfig does), or HTTP-01 through
// HTTPHandler on port 80.
type ACME struct {
	mgr        *autocert.Manager
	httpClient *http.Client
	domains    map[string]bool // normalized: lower-case A-labels, no final dot
	logger     *slog.Logger
	now        func() time.Time

	mu sync.Mutex // guards the maps below
	// failed is the last error logged per domain, so a CA outage is logged
	// when its message changes, not at every handshake.
	failed map[string]string
	// served is the serial last served per domain, to log each new
	// certificate once; warned the serial whose overdue renewal was logged.
	served map[string]string
	warned map[string]string
}

// NewACME validates cfg and returns an ACME certificate source. It creates
// cfg.CacheDir but contacts no one: the account is registered and the
// first certificate ordered on the first handshake.
func NewACME(cfg ACMEConfig, logger *slog.Logger) (*ACME, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	domains, dirURL, err := cfg.check()
	if err != nil {
		return nil, err
	}
	if err := prepareACMECacheDir(cfg.CacheDir, logger); err != nil {
		return nil, fmt.Errorf("bundleserver: acme: cache directory %s: %w", cfg.CacheDir, err)
	}
	hc := newACMEHTTPClient(cfg.RootCAs)
	allowed := make(map[string]bool, len(domains))
	for _, d := range domains {
		allowed[d] = true
	}
	a := &ACME{
		httpClient: hc,
		domains:    allowed,
		logger:     logger.With(logattr.Component, "acme"),
		now:        time.Now,
		failed:     make(map[string]string),
		served:     make(map[string]string),
		warned:     make(map[string]string),
	}
	a.mgr = &autocert.Manager{
		Prompt: func(tosURL string) bool {
			a.logger.Info("accepting the ACME CA's terms of service (--acme-tos-accepted)", "tos_url", tosURL)
			return true
		},
		Cache:      autocert.DirCache(cfg.CacheDir),
		HostPolicy: autocert.HostWhitelist(domains...),
		Client: &acme.Client{
			DirectoryURL: dirURL,
			HTTPClient:   hc,
			UserAgent:    "trustbridge",
		},
		Email: cfg.Email,
	}
	a.logger.Info("ACME configured", "directory_url", dirURL, "domains", domains, "cache_dir", cfg.CacheDir)
	return a, nil
}

// check validates cfg without touching the disk, and returns its domains
// normalized and its directory URL defaulted.
func (cfg *ACMEConfig) check() (domains []string, dirURL string, err error) {
	domains, err = normalizeACMEDomains(cfg.Domains)
	if err != nil {
		return nil, "", fmt.Errorf("bundleserver: acme: %w", err)
	}
	if cfg.Email != "" {
		if a, err := mail.ParseAddress(cfg.Email); err != nil || a.Address != cfg.Email {
			return nil, "", fmt.Errorf("bundleserver: acme: email %q: want a bare address such as ops@example.com", cfg.Email)
		}
	}
	dirURL = cmp.Or(cfg.DirectoryURL, acme.LetsEncryptURL)
	if u, err := url.Parse(dirURL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return nil, "", fmt.Errorf("bundleserver: acme: directory URL %q: want an https URL without user info", dirURL)
	}
	if !cfg.TOSAccepted {
		return nil, "", fmt.Errorf("bundleserver: acme: the CA's terms of service must be accepted: read the terms published by %s (for Let's Encrypt, https://letsencrypt.org/repository/) and pass --acme-tos-accepted", dirURL)
	}
	if cfg.CacheDir == "" {
		return nil, "", errors.New("bundleserver: acme: a cache directory is required: without one every restart orders new certificates and soon hits the CA's rate limits")
	}
	return domains, dirURL, nil
}

// newACMEHTTPClient is the client that talks to the ACME directory,
// verifying it with roots (nil: the system roots) and following only
// https redirects.
func newACMEHTTPClient(roots *x509.CertPool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{
		Transport:     tr,
		Timeout:       acmeHTTPTimeout,
		CheckRedirect: checkACMERedirect,
	}
}

// checkACMERedirect refuses a redirect to anything but https, and more
// than 5 redirects: Go follows https → http redirects by default, and an
// ACME client signs its requests and must not send them in the clear.
func checkACMERedirect(req *http.Request, via []*http.Request) error {
	if req.URL.Scheme != "https" {
		return fmt.Errorf("refusing redirect to %s: not https", req.URL.Redacted())
	}
	if len(via) >= 5 {
		return errors.New("stopped after 5 redirects")
	}
	return nil
}

// GetCertificate is a tls.Config.GetCertificate hook. It answers
// TLS-ALPN-01 challenges, serves the certificate for a configured name
// (ordering it on first use), and refuses any other name. autocert has no
// hooks, so failures and new certificates are logged here.
func (a *ACME) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert, err := a.mgr.GetCertificate(hello)
	if len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acme.ALPNProto {
		// A CA validating a challenge: nothing to track.
		if err != nil {
			a.logger.Debug("no TLS-ALPN-01 challenge certificate", "server_name", hello.ServerName, logattr.Error, err)
		}
		return cert, err
	}
	name := normalizeSNI(hello.ServerName)
	if err != nil {
		a.logFailure(name, hello.ServerName, err)
		return nil, fmt.Errorf("bundleserver: acme: %w", err)
	}
	a.observe(name, cert)
	return cert, nil
}

// TLSConfig returns a server configuration serving GetCertificate, with
// acme.ALPNProto among the NextProtos so TLS-ALPN-01 works. Callers that
// build their own tls.Config must keep that protocol.
func (a *ACME) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: a.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1", acme.ALPNProto},
	}
}

// HTTPHandler answers HTTP-01 challenges on port 80 and passes every other
// request to fallback (nil redirects to https). Calling it also enables
// HTTP-01 as a fallback challenge type.
func (a *ACME) HTTPHandler(fallback http.Handler) http.Handler {
	return a.mgr.HTTPHandler(fallback)
}

// logFailure logs handshake failures. Names not configured are anyone's
// to send and only worth a debug line; for a configured name, the failure
// is an issuance problem, logged when its message changes. While a failed
// order waits out autocert's one-minute retry delay, handshakes see
// "missing certificate": one more line, then quiet.
func (a *ACME) logFailure(name, sni string, err error) {
	if !a.domains[name] {
		a.logger.Debug("refused TLS handshake for a name not configured for ACME", "server_name", sni, logattr.Error, err)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failed[name] == err.Error() {
		return
	}
	a.failed[name] = err.Error()
	a.logger.Error("ACME certificate unavailable", "server_name", name, logattr.Error, err)
}

// observe logs each new certificate once and warns when renewal is
// overdue: autocert renews silently in the background, and its failures
// surface nowhere else before the certificate expires.
func (a *ACME) observe(name string, cert *tls.Certificate) {
	leaf := cert.Leaf
	if leaf == nil {
		return
	}
	serial := leaf.SerialNumber.Text(16)
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if prev, ok := a.failed[name]; ok {
		delete(a.failed, name)
		a.logger.Info("ACME certificate available again", "server_name", name, "previous_error", prev)
	}
	if a.served[name] != serial {
		a.served[name] = serial
		a.logger.Info("serving ACME certificate",
			"server_name", name,
			"issuer", leaf.Issuer.String(),
			"serial", serial,
			"not_after", leaf.NotAfter)
	}
	if msg := renewalOverdue(leaf, now); msg != "" && a.warned[name] != serial+msg {
		a.warned[name] = serial + msg
		a.logger.Error("ACME "+msg+"; check earlier errors and the CA's status",
			"server_name", name, "serial", serial, "not_after", leaf.NotAfter)
	}
}

// renewalOverdue says whether leaf should have been replaced by now.
// autocert starts renewing at the lesser of a third of the lifetime and 30
// days before expiry, retrying every 30 to 60 minutes; halfway through
// that window a healthy setup has long succeeded.
func renewalOverdue(leaf *x509.Certificate, now time.Time) string {
	if now.After(leaf.NotAfter) {
		return "certificate expired and was not renewed"
	}
	window := min(leaf.NotAfter.Sub(leaf.NotBefore)/3, 30*24*time.Hour)
	if leaf.NotAfter.Sub(now) < window/2 {
		return "certificate renewal is overdue"
	}
	return ""
}

// normalizeSNI maps a server name as autocert does: A-labels, lower case,
// no final dot.
func normalizeSNI(sni string) string {
	name, err := idna.Lookup.ToASCII(sni)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(name, ".")
}

// normalizeACMEDomains checks each name is one autocert can obtain a
// certificate for with TLS-ALPN-01 or HTTP-01, and returns them as
// lower-case A-labels.
func normalizeACMEDomains(domains []string) ([]string, error) {
	if len(domains) == 0 {
		return nil, errors.New("at least one domain (--acme-domain) is required")
	}
	out := make([]string, 0, len(domains))
	seen := make(map[string]int, len(domains))
	for i, d := range domains {
		n, err := normalizeACMEDomain(d)
		if err != nil {
			return nil, fmt.Errorf("domain %d (%q): %w", i+1, d, err)
		}
		if j, ok := seen[n]; ok {
			return nil, fmt.Errorf("domain %d (%q): same name as domain %d", i+1, d, j+1)
		}
		seen[n] = i
		out = append(out, n)
	}
	return out, nil
}

func normalizeACMEDomain(d string) (string, error) {
	// A final dot is DNS's root, not part of the name; clients never send
	// it in SNI.
	d = strings.TrimSuffix(d, ".")
	switch {
	case d == "":
		return "", errors.New("empty")
	case !utf8.ValidString(d):
		return "", errors.New("not valid UTF-8")
	case strings.Contains(d, "*"):
		return "", errors.New("wildcards need the DNS-01 challenge, which this server cannot answer")
	case net.ParseIP(strings.Trim(d, "[]")) != nil:
		return "", errors.New("IP addresses are not supported; use a DNS name")
	case strings.ContainsAny(d, ":/@ \t"):
		return "", errors.New("want a bare host name, without scheme, port or path")
	}
	n, err := idna.Lookup.ToASCII(d)
	if err != nil {
		return "", fmt.Errorf("not a valid host name: %w", err)
	}
	// A handshake's SNI is mapped the same way; a name that does not map
	// to itself could never match one.
	if again, err := idna.Lookup.ToASCII(n); err != nil || again != n {
		return "", errors.New("not a valid host name: its A-label form does not round-trip")
	}
	if len(n) > 253 {
		return "", errors.New("longer than 253 characters")
	}
	labels := strings.Split(n, ".")
	if len(labels) < 2 {
		return "", errors.New("want a fully qualified name with at least two labels")
	}
	for _, l := range labels {
		if err := checkDNSLabel(l); err != nil {
			return "", err
		}
	}
	return n, nil
}

func checkDNSLabel(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q: want 1 to 63 characters", l)
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q: must not start or end with a hyphen", l)
	}
	for _, c := range []byte(l) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return fmt.Errorf("label %q: character %q is not a letter, digit or hyphen", l, c)
		}
	}
	return nil
}

// prepareACMECacheDir creates dir 0700, or tightens an existing one: it
// holds the ACME account key and the certificates' private keys.
// autocert.DirCache writes each file 0600 itself.
func prepareACMECacheDir(dir string, logger *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("mode %#o lets other users read private keys, and tightening it failed: %w", perm, err)
		}
		logger.Warn("ACME cache directory was readable by other users; changed its mode to 0700", "cache_dir", dir, "previous_mode", fmt.Sprintf("%#o", perm))
	}
	return nil
}
