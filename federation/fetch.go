package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/netutil"
)

// Kinds of fetch failure. Every error Fetch returns wraps at most one of
// them (plus the underlying cause), so status reports and metrics can label
// a failure without parsing messages. FetchErrorKind maps an error to a
// stable label.
var (
	// ErrStatus: the endpoint answered with a status other than 200 (or a
	// 304 we did not ask for). The body is never parsed.
	ErrStatus = errors.New("unexpected HTTP status")
	// ErrTooLarge: the body exceeded FetcherConfig.MaxSize. It is
	// bundledoc.ErrTooLarge, so either name matches.
	ErrTooLarge = bundledoc.ErrTooLarge
	// ErrTLS: the server could not be authenticated for the endpoint's
	// profile (Web PKI failure, or not an X509-SVID for exactly the
	// endpoint SPIFFE ID).
	ErrTLS = errors.New("endpoint authentication failed")
	// ErrProfileMismatch: the server authenticates the way the other
	// profile would: an https_spiffe endpoint presenting a certificate
	// without a SPIFFE ID (a Web PKI certificate), or an https_web endpoint
	// presenting an X509-SVID. A client that fell back to the other
	// profile (§7.2 forbids it) would have accepted the server; operators
	// should know someone tried. It is always wrapped with ErrTLS.
	ErrProfileMismatch = errors.New("server presented the other profile's certificate")
	// ErrRefusedAddress: the endpoint URL or a redirect resolved to a
	// loopback, link-local or unspecified address (unless
	// FetcherConfig.AllowPrivate), or to a cloud metadata address, in any
	// spelling (NAT64, 6to4, Teredo, IPv4-mapped or -compatible).
	// It is dialguard.ErrRefusedAddress, so either name matches.
	ErrRefusedAddress = netutil.ErrRefusedAddress
	// ErrRedirect: a redirect was refused (not https, too many hops).
	ErrRedirect = errors.New("redirect refused")
	// ErrContentType: the response declared a media type that cannot be a
	// bundle document (text/html: an error page, a captive portal).
	ErrContentType = errors.New("unacceptable content type")
	// ErrBundle: the body is not a valid bundle document for the expected
	// trust domain.
	ErrBundle = errors.New("invalid bundle document")
)

// FetchErrorKind returns a short stable label for a Fetch error, for metric
// labels and status: "status", "too_large", "profile_mismatch", "tls", "refused_address",
// "redirect", "content_type", "bundle", "timeout", "canceled", or
// "transport" for anything else (refused connection, reset, DNS).
func FetchErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrRefusedAddress):
		return "refused_address"
	case errors.Is(err, ErrRedirect):
		return "redirect"
	case errors.Is(err, ErrProfileMismatch):
		return "profile_mismatch"
	case errors.Is(err, ErrTLS):
		return "tls"
	case errors.Is(err, ErrStatus):
		return "status"
	case errors.Is(err, ErrTooLarge):
		return "too_large"
	case errors.Is(err, ErrContentType):
		return "content_type"
	case errors.Is(err, ErrBundle):
		return "bundle"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	default:
		return "transport"
	}
}

// CodeContentType marks a FetchResult warning about a missing or unusual
// Content-Type (the spec says application/json SHOULD be set).
const CodeContentType bundledoc.WarningCode = "content_type"

// BundleSource gives the X.509 roots that authenticate https_spiffe
// endpoint servers: the latest bundle held for the endpoint SPIFFE ID's
// trust domain (the bootstrap bundle before the first successful fetch,
// §5.2.2.2).
type BundleSource interface {
	X509BundleFor(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool)
}

// BundleSourceFunc adapts a function to BundleSource.
type BundleSourceFunc func(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool)

// X509BundleFor calls f.
func (f BundleSourceFunc) X509BundleFor(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
	return f(td)
}

// Fetch defaults.
const (
	DefaultFetchTimeout = 10 * time.Second
	DefaultMaxRedirects = 3
	// maxResponseHeaderBytes bounds the headers as MaxSize bounds the body.
	maxResponseHeaderBytes = 64 << 10
)

// FetcherConfig configures a Fetcher. Zero values take the defaults.
type FetcherConfig struct {
	// Timeout bounds the whole request: dial, TLS, redirects, headers and
	// body. Default DefaultFetchTimeout.
	Timeout time.Duration
	// MaxSize caps the body; a larger one is an error, never truncated.
	// Default bundledoc.DefaultMaxSize (1 MiB).
	MaxSize int64
	// WebRoots verifies https_web servers; nil means the system pool. The
	// caller adds --federation-ca-file roots to a system pool copy.
	WebRoots *x509.CertPool
	// AllowPrivate permits loopback, unspecified (0.0.0.0/8, ::) and
	// link-local addresses, for labs and tests. Cloud metadata and
	// credential addresses (see dialguard.Classify) stay refused: nothing
	// legitimate serves a bundle there.
	AllowPrivate bool
	// Roots authenticates https_spiffe servers. Required for that profile.
	Roots BundleSource
	// MaxRedirects is the number of redirects followed per fetch. Zero
	// means DefaultMaxRedirects; negative means none.
	MaxRedirects int

	// withTimeout puts the Timeout deadline on each fetch's context; nil
	// means context.WithTimeout. Only tests set it, so that a fetch held
	// open by a fault ends when the test says its deadline has passed,
	// not after Timeout of real time.
	withTimeout func(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

// FetchResult is the outcome of a successful Fetch.
type FetchResult struct {
	// Bundle is the parsed bundle, for the endpoint's trust domain. Nil
	// when NotModified.
	Bundle *spiffebundle.Bundle
	// Warnings lists ignored elements and an unusual Content-Type.
	Warnings []bundledoc.Warning
	// Revocations are the authorities the document lists as revoked
	// (bundledoc.RevokedMember): the relationship holds them so that no
	// later bundle brings one back.
	Revocations []bundledoc.Revocation
	// ETag is the response's entity tag, to send on the next fetch.
	ETag string
	// NotModified is set on a 304 answer to If-None-Match.
	NotModified bool
	// Raw is the body as received, for forensics (§7.6).
	Raw []byte
}

// Fetcher fetches bundles from bundle endpoints (SPIFFE Federation §5).
// It is safe for concurrent use; each Fetch uses its own transport with
// keep-alives off, so no connection outlives a poll and one endpoint's
// state never leaks into another's.
type Fetcher struct {
	cfg FetcherConfig
}

// NewFetcher returns a Fetcher with cfg's defaults applied.
func NewFetcher(cfg FetcherConfig) *Fetcher {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultFetchTimeout
	}
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = bundledoc.DefaultMaxSize
	}
	if cfg.MaxRedirects == 0 {
		cfg.MaxRedirects = DefaultMaxRedirects
	} else if cfg.MaxRedirects < 0 {
		cfg.MaxRedirects = 0
	}
	if cfg.withTimeout == nil {
		cfg.withTimeout = context.WithTimeout
	}
	return &Fetcher{cfg: cfg}
}

// Fetch fetches ep's bundle once. etag, when set, is sent as If-None-Match;
// a 304 answer yields NotModified. Fetch always starts at ep.URL: a
// redirect is followed for this fetch only (§7.5.1). On error nothing is
// returned and the caller keeps its last good bundle.
func (f *Fetcher) Fetch(ctx context.Context, ep Endpoint, etag string) (*FetchResult, error) {
	res, err := f.fetch(ctx, ep, etag)
	if err != nil {
		return nil, fmt.Errorf("federation: fetch %q bundle from %s: %w", ep.TrustDomain.Name(), urlString(ep.URL), err)
	}
	return res, nil
}

func (f *Fetcher) fetch(ctx context.Context, ep Endpoint, etag string) (*FetchResult, error) {
	if ep.URL == nil || ep.URL.Scheme != "https" {
		return nil, errors.New("endpoint URL must be https")
	}
	if ep.TrustDomain.IsZero() {
		return nil, errors.New("endpoint trust domain is missing")
	}
	tlsConfig, err := f.tlsConfig(ep)
	if err != nil {
		return nil, err
	}
	parent := ctx
	ctx, cancel := f.cfg.withTimeout(ctx, f.cfg.Timeout)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	client, done := f.client(tlsConfig)
	defer done()
	resp, err := client.Do(req)
	if err != nil {
		return nil, f.timeoutError(parent, ctx, classifyTransportError(err))
	}
	defer resp.Body.Close()

	switch {
	case resp.StatusCode == http.StatusNotModified && etag != "":
		res := &FetchResult{NotModified: true, ETag: resp.Header.Get("ETag")}
		if res.ETag == "" {
			res.ETag = etag
		}
		return res, nil
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%w %s from %s", ErrStatus, resp.Status, urlString(resp.Request.URL))
	}
	return f.readBundle(parent, ctx, ep, resp)
}

// client is an HTTP client for one fetch, with its own transport; done
// closes the transport's connections.
func (f *Fetcher) client(tlsConfig *tls.Config) (c *http.Client, done func()) {
	dialer := &net.Dialer{Control: f.controlDial}
	transport := &http.Transport{
		// No proxy: the address check must see the real peer, and a bundle
		// endpoint is never reached through an environment-chosen proxy.
		Proxy:                  nil,
		DialContext:            dialer.DialContext,
		TLSClientConfig:        tlsConfig,
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	return &http.Client{Transport: transport, CheckRedirect: f.checkRedirect}, transport.CloseIdleConnections
}

// readBundle reads and parses a 200 answer's body within ctx, the fetch's
// deadline under the caller's parent.
func (f *Fetcher) readBundle(parent, ctx context.Context, ep Endpoint, resp *http.Response) (*FetchResult, error) {
	var warnings []bundledoc.Warning
	if w, err := checkContentType(resp.Header.Get("Content-Type")); err != nil {
		return nil, err
	} else if w != "" {
		warnings = append(warnings, bundledoc.Warning{Index: -1, Code: CodeContentType, Message: w})
	}

	raw, err := bundledoc.ReadLimited(resp.Body, f.cfg.MaxSize)
	if ctx.Err() != nil {
		// The deadline (or the caller) ended the read: say so, whatever the
		// transport wrapped it in. Even a read that reported no error is
		// refused, since a cancelled chunked body can end looking like a
		// clean EOF, and a truncated document must never be taken for a
		// smaller one.
		err = ctx.Err()
	}
	if err != nil {
		return nil, f.timeoutError(parent, ctx, fmt.Errorf("read body: %w", err))
	}
	b, parseWarnings, revs, err := parseDocument(ep.TrustDomain, raw)
	if err != nil {
		return nil, err
	}
	return &FetchResult{
		Bundle:      b,
		Warnings:    append(warnings, parseWarnings...),
		Revocations: revs,
		ETag:        resp.Header.Get("ETag"),
		Raw:         raw,
	}, nil
}

// timeoutError names the timeout when our own deadline, not the caller,
// ended the request: "context deadline exceeded" alone does not tell an
// operator which limit was hit.
func (f *Fetcher) timeoutError(parent, ctx context.Context, err error) error {
	if parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no complete answer within %s: %w", f.cfg.Timeout, err)
	}
	return err
}

// tlsConfig builds the client TLS configuration for ep's profile. There is
// no fallback: an https_spiffe endpoint is never tried with Web PKI or the
// other way round (§7.1). Neither has a session cache: no resumption, so
// every handshake verifies (VerifyConnection would run on resumption
// anyway).
func (f *Fetcher) tlsConfig(ep Endpoint) (*tls.Config, error) {
	switch ep.Profile {
	case ProfileHTTPSWeb:
		// ServerName is left empty: the transport sets it per host, so a
		// redirect target gets its own RFC 6125 host check.
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: f.cfg.WebRoots}, nil
	case ProfileHTTPSSPIFFE:
		if ep.EndpointSPIFFEID.IsZero() {
			return nil, errors.New("https_spiffe endpoint has no endpoint SPIFFE ID")
		}
		if f.cfg.Roots == nil {
			return nil, errors.New("https_spiffe endpoint needs a bundle source (FetcherConfig.Roots)")
		}
		// Host names mean nothing for https_spiffe (§5.2.2): the identity
		// is the SPIFFE ID, which trust.Verifier checks on every
		// handshake, including the ones after a redirect, against the
		// roots of its own trust domain only.
		want := ep.EndpointSPIFFEID
		cfg := trust.ClientTLSConfig(nil, &trust.Verifier{Bundles: x509Source{f.cfg.Roots}, Authorizer: tlsconfig.AuthorizeID(want)})
		verify := cfg.VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return endpointError(verify(cs), cs.PeerCertificates, want)
		}
		return cfg, nil
	default:
		return nil, fmt.Errorf("profile %q is not one of %s, %s", ep.Profile, ProfileHTTPSWeb, ProfileHTTPSSPIFFE)
	}
}

// endpointError tags the verifier's refusal of an https_spiffe server as
// ErrTLS and says what was wrong for an operator reading a poll failure.
func endpointError(err error, certs []*x509.Certificate, want spiffeid.ID) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, trust.ErrNoPeerCertChain):
		return fmt.Errorf("%w: server presented no certificate", ErrTLS)
	case errors.Is(err, trust.ErrNotSVID) && len(certs[0].URIs) == 0:
		return fmt.Errorf("%w: %w: https_spiffe endpoint presented a certificate without a SPIFFE ID (%s), as an https_web server would: %w",
			ErrTLS, ErrProfileMismatch, certs[0].Subject, err)
	case errors.Is(err, trust.ErrNotSVID):
		return fmt.Errorf("%w: server certificate is not an X509-SVID: %w", ErrTLS, err)
	case errors.Is(err, trust.ErrUnauthorized):
		// Only a verified SVID reaches the authorizer: one URI SAN.
		return fmt.Errorf("%w: server presented SPIFFE ID %q, want %q", ErrTLS, certs[0].URIs[0], want)
	case errors.Is(err, trust.ErrUnknownDomain):
		return fmt.Errorf("%w: no X.509 roots held to authenticate %q: %w", ErrTLS, want, err)
	default:
		return fmt.Errorf("%w: server X509-SVID for %q: %w", ErrTLS, want, err)
	}
}

// x509Source adapts BundleSource to go-spiffe's x509bundle.Source.
type x509Source struct{ roots BundleSource }

func (s x509Source) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	b, ok := s.roots.X509BundleFor(td)
	if !ok || b == nil {
		return nil, fmt.Errorf("no roots held for trust domain %q", td.Name())
	}
	return b, nil
}

// checkRedirect applies §7.5.1: follow a bounded number of https redirects;
// the transport applies the same TLS checks and dial control at the new
// location, and nothing is persisted.
func (f *Fetcher) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > f.cfg.MaxRedirects {
		return fmt.Errorf("%w: more than %d redirect(s), last to %s", ErrRedirect, f.cfg.MaxRedirects, urlString(req.URL))
	}
	u := req.URL
	switch {
	case u.Scheme != "https":
		return fmt.Errorf("%w: redirect to %s: scheme must be https", ErrRedirect, urlString(u))
	case u.User != nil:
		return fmt.Errorf("%w: redirect to %s: must not contain userinfo", ErrRedirect, urlString(u))
	case u.Hostname() == "":
		return fmt.Errorf("%w: redirect to %s: host is missing", ErrRedirect, urlString(u))
	}
	return nil
}

// controlDial runs after name resolution, for every address dialed
// (including redirect targets), before any packet is sent. It is
// dialguard.Control with federation's own words: operators grep logs and
// alerts for "never a bundle endpoint".
func (f *Fetcher) controlDial(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot parse dial address %q: %w", ErrRefusedAddress, address, err)
	}
	switch v := netutil.ClassifyAddr(ap.Addr()); {
	case v.Class == netutil.AddrOpen, v.Class == netutil.AddrLocal && f.cfg.AllowPrivate:
		return nil
	case v.Class == netutil.AddrLocal:
		return fmt.Errorf("%w: %s is %s; set --federation-allow-private to allow it", ErrRefusedAddress, address, v.Why)
	default:
		return fmt.Errorf("%w: %s is %s, never a bundle endpoint (refused even with --federation-allow-private)", ErrRefusedAddress, address, v.Why)
	}
}

// checkContentType refuses a media type that cannot be a bundle document
// and warns about one that is merely unusual. The spec only says servers
// SHOULD send application/json, so anything else is tolerated.
func checkContentType(ct string) (warning string, err error) {
	if ct == "" {
		return "response has no Content-Type (application/json expected)", nil
	}
	mt, _, perr := mime.ParseMediaType(ct)
	if perr != nil {
		return fmt.Sprintf("response Content-Type %q does not parse: %v", ct, perr), nil
	}
	switch {
	case mt == "application/json", strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"):
		return "", nil
	case mt == "text/html", mt == "application/xhtml+xml":
		return "", fmt.Errorf("%w: %q is a web page, not a bundle document", ErrContentType, mt)
	default:
		return fmt.Sprintf("response Content-Type is %q, not application/json", mt), nil
	}
}

// classifyTransportError tags a client.Do error with its kind. Errors from
// our own hooks already carry theirs; Web PKI failures are tagged ErrTLS.
func classifyTransportError(err error) error {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		// url.Error repeats method and URL; Fetch names the URL already,
		// and a redirect error names its own target.
		err = ue.Err
	}
	switch {
	case errors.Is(err, ErrRefusedAddress), errors.Is(err, ErrRedirect), errors.Is(err, ErrTLS):
		return err
	}
	var (
		cve  *tls.CertificateVerificationError
		uae  x509.UnknownAuthorityError
		he   x509.HostnameError
		cie  x509.CertificateInvalidError
		rhe  tls.RecordHeaderError
		alrt tls.AlertError
		oe   *net.OpError
	)
	switch {
	case errors.As(err, &cve) && len(cve.UnverifiedCertificates) > 0 && isSVIDOnly(cve.UnverifiedCertificates[0]):
		return fmt.Errorf("%w: %w: https_web endpoint presented an X509-SVID (%s) without a host name, as an https_spiffe server would: %w",
			ErrTLS, ErrProfileMismatch, cve.UnverifiedCertificates[0].URIs[0], err)
	case errors.As(err, &cve), errors.As(err, &uae), errors.As(err, &he), errors.As(err, &cie):
		return fmt.Errorf("%w: %w", ErrTLS, err)
	case errors.As(err, &rhe):
		return fmt.Errorf("%w: server does not speak TLS: %w", ErrTLS, err)
	case errors.As(err, &alrt):
		return fmt.Errorf("%w: server sent TLS alert: %w", ErrTLS, err)
	case errors.As(err, &oe) && oe.Op == "remote error":
		// crypto/tls reports an alert from the server this way
		// (version or cipher mismatch, or the server refused us).
		return fmt.Errorf("%w: server aborted the TLS handshake: %w", ErrTLS, err)
	}
	return err
}

// isSVIDOnly reports whether c looks like an X509-SVID rather than a Web
// PKI server certificate: a spiffe URI SAN and no DNS or IP SAN.
func isSVIDOnly(c *x509.Certificate) bool {
	return len(c.URIs) > 0 && c.URIs[0].Scheme == "spiffe" && len(c.DNSNames) == 0 && len(c.IPAddresses) == 0
}

// urlString renders u for errors; endpoint URLs never carry userinfo, but a
// redirect Location might.
func urlString(u *url.URL) string {
	if u == nil {
		return "<nil>"
	}
	return u.Redacted()
}
