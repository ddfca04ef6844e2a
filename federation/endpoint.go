package federation

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// Profile is a bundle endpoint profile (SPIFFE Federation §5.2). It decides
// how the endpoint server is authenticated; there is deliberately no
// fallback from one profile to the other (§7.1).
type Profile string

// The two profiles every bundle endpoint client must support (§5).
const (
	// ProfileHTTPSWeb authenticates the server with Web PKI (§5.2.1).
	ProfileHTTPSWeb Profile = "https_web"
	// ProfileHTTPSSPIFFE authenticates the server by its X509-SVID, which must
	// carry Endpoint.EndpointSPIFFEID (§5.2.2).
	ProfileHTTPSSPIFFE Profile = "https_spiffe"
)

// Refresh bounds the polling interval of one endpoint. A zero field means
// "use the server-wide clamp", so a YAML entry can override just one bound.
type Refresh struct {
	Min, Max time.Duration
}

// Endpoint is one federation relationship: the three parameters the spec
// requires together (§5.1, §7.2) plus what a profile or bootstrap needs.
// Values returned by ParseEndpoints and ParseConfig are valid; an Endpoint
// built by hand is checked by MergeEndpoints.
type Endpoint struct {
	TrustDomain spiffeid.TrustDomain
	URL         *url.URL
	Profile     Profile
	// EndpointSPIFFEID is the ID the server's X509-SVID must carry. Set only
	// for ProfileHTTPSSPIFFE.
	EndpointSPIFFEID spiffeid.ID
	// BootstrapBundle, when set, is the operator-supplied bundle of
	// TrustDomain: it seeds the trust store and authenticates the first fetch
	// from a self-serving https_spiffe endpoint (§5.2.2.2). The YAML form
	// carries it (trustDomainBundle, trustDomainBundleFile), and so does the
	// string form's fourth field (ParseEndpointsConfig).
	BootstrapBundle *spiffebundle.Bundle
	// BootstrapBundleFile is the trustDomainBundleFile path (or the fourth
	// tuple field) as configured, kept for display only.
	BootstrapBundleFile string
	// Refresh is set only by the YAML form.
	Refresh Refresh
}

// String returns the endpoint in the tuple form of ParseEndpoints:
// "td|url" for https_web, "td|url|spiffe-id" for https_spiffe. The
// bootstrap bundle file and refresh bounds are left out: the string names
// the relationship in errors and logs.
func (e Endpoint) String() string {
	var b strings.Builder
	b.WriteString(e.TrustDomain.Name())
	b.WriteByte('|')
	if e.URL != nil {
		b.WriteString(e.URL.String())
	}
	if e.Profile == ProfileHTTPSSPIFFE {
		b.WriteByte('|')
		b.WriteString(e.EndpointSPIFFEID.String())
	}
	return b.String()
}

// ParseEndpoints parses the Istio string form used by --federate and
// SPIFFE_BUNDLE_ENDPOINTS: tuples separated by "||", fields by "|".
//
//	foo.com|https://foo.com/bundle||bar.com|https://bar.com:8443/|spiffe://bar.com/spire/server
//
// A two-field tuple (trust domain, URL) is https_web, exactly as in Istio.
// A third field, our extension, is the endpoint SPIFFE ID and makes the
// tuple https_spiffe. Whitespace around a tuple is ignored (so a multi-line
// YAML env value works); whitespace inside a field is an error. Empty or
// all-whitespace input yields no endpoints. A fourth field (a bootstrap
// bundle file) needs ParseEndpointsConfig, which reads it.
//
// Errors name the offending tuple by its 0-based index and its text. On any
// error no endpoints are returned: a partial federation set would silently
// drop trust in the peers that failed.
func ParseEndpoints(s string) ([]Endpoint, error) {
	cfg, err := ParseEndpointsConfig(s, nil)
	if err != nil {
		return nil, err
	}
	return cfg.Endpoints, nil
}

// ParseEndpointsConfig is ParseEndpoints with our second extension, a
// fourth field naming the bootstrap bundle file of an https_spiffe tuple
// (the YAML form's trustDomainBundleFile):
//
//	bar.com|https://bar.com:8443/|spiffe://bar.com/spire/server|/etc/trustbridge/bar.com.json
//
// readFile loads the file exactly as named (resolving a relative path is
// the caller's business); with a nil readFile a fourth field is an error,
// as in ParseEndpoints.
// The path may hold no whitespace, control character or "|". The bundle
// obeys the same rules as trustDomainBundleFile, and Warnings are the
// elements of it that were ignored.
func ParseEndpointsConfig(s string, readFile func(path string) ([]byte, error)) (*Config, error) {
	cfg := &Config{}
	if strings.Trim(s, asciiSpace) == "" {
		return cfg, nil
	}
	tuples := strings.Split(s, "||")
	cfg.Endpoints = make([]Endpoint, 0, len(tuples))
	seen := make(trustDomainSet, len(tuples))
	for i, raw := range tuples {
		tuple := strings.Trim(raw, asciiSpace)
		where := fmt.Sprintf("endpoint %d (%q)", i, redact(tuple))
		ep, warnings, err := parseTuple(tuple, readFile)
		if err == nil {
			err = seen.add(ep.TrustDomain, where)
		}
		if err != nil {
			return nil, fmt.Errorf("federation: %s: %w", where, err)
		}
		for _, w := range warnings {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s: bundle file %q: %s", where, ep.BootstrapBundleFile, w.String()))
		}
		cfg.Endpoints = append(cfg.Endpoints, ep)
	}
	return cfg, nil
}

func parseTuple(tuple string, readFile func(string) ([]byte, error)) (Endpoint, []bundledoc.Warning, error) {
	ep, err := parseTupleFields(tuple, readFile != nil)
	if err != nil {
		return Endpoint{}, nil, err
	}
	fields := strings.Split(tuple, "|")
	if len(fields) < 4 {
		return ep, nil, nil
	}
	name := fields[3]
	if err := checkTupleFile(name); err != nil {
		return Endpoint{}, nil, fmt.Errorf("bootstrap bundle file %q: %w", name, err)
	}
	doc, err := readBootstrapFile(name, readFile)
	if err != nil {
		return Endpoint{}, nil, fmt.Errorf("bootstrap bundle file %q: %w", name, err)
	}
	ep.BootstrapBundleFile = name
	warnings, err := setBootstrap(&ep, doc)
	if err != nil {
		return Endpoint{}, nil, fmt.Errorf("bootstrap bundle file %q: %w", name, err)
	}
	return ep, warnings, nil
}

// checkTupleFile checks the fourth field of a tuple before it is read.
func checkTupleFile(name string) error {
	if name == "" {
		return errors.New("is empty")
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f || strings.ContainsRune(asciiSpace, r) {
			return fmt.Errorf("contains %q; a path in a tuple cannot hold whitespace or control characters (use trustDomainBundleFile in --federation-config for such a path)", r)
		}
	}
	return nil
}

// readBootstrapFile reads a bootstrap bundle file, capped at what a
// fetched bundle may weigh.
func readBootstrapFile(name string, readFile func(string) ([]byte, error)) ([]byte, error) {
	doc, err := readFile(name)
	if err != nil {
		return nil, err
	}
	if len(doc) > bundledoc.DefaultMaxSize {
		return nil, fmt.Errorf("larger than %d bytes", bundledoc.DefaultMaxSize)
	}
	return doc, nil
}

// SetBootstrapBundle parses doc as e's bootstrap bundle and checks it
// against e, as every way of configuring an endpoint does (setBootstrap),
// for a caller that checks a bundle before it sends it on. A refusal
// names no document: the caller does.
func (e *Endpoint) SetBootstrapBundle(doc []byte) ([]bundledoc.Warning, error) {
	return setBootstrap(e, doc)
}

// setBootstrap parses doc as ep's bootstrap bundle and checks it against
// ep, for every form that carries one. doc is a SPIFFE bundle document or
// PEM certificates (a root-cert.pem from Istio's cacerts, a `spire-server
// bundle show -format pem`), held to the same rules: CA certificates only,
// and none naming another trust domain, which the poller would refuse in a
// fetched bundle too (RefusedWarning).
func setBootstrap(ep *Endpoint, doc []byte) ([]bundledoc.Warning, error) {
	b, warnings, err := bundledoc.ParseAny(ep.TrustDomain, doc)
	if err != nil {
		// Every caller names the document (a file, a flag, a key).
		return nil, bundledoc.Cause(err)
	}
	if err := RefusedWarning(warnings); err != nil {
		return nil, err
	}
	ep.BootstrapBundle = b
	if err := checkBootstrap(*ep); err != nil {
		return nil, err
	}
	return warnings, nil
}

// parseTupleFields parses the first three fields; withFile allows a
// fourth, which the caller reads.
func parseTupleFields(tuple string, withFile bool) (Endpoint, error) {
	if tuple == "" {
		return Endpoint{}, errors.New(`empty tuple (stray "||"?)`)
	}
	fields := strings.Split(tuple, "|")
	switch {
	case withFile && (len(fields) < 2 || len(fields) > 4):
		return Endpoint{}, fmt.Errorf("has %d field(s), want trust-domain|url, trust-domain|url|endpoint-spiffe-id or trust-domain|url|endpoint-spiffe-id|bundle-file", len(fields))
	case !withFile && (len(fields) < 2 || len(fields) > 3):
		return Endpoint{}, fmt.Errorf("has %d field(s), want trust-domain|url or trust-domain|url|endpoint-spiffe-id", len(fields))
	}
	td, err := parseTrustDomain(fields[0])
	if err != nil {
		return Endpoint{}, fmt.Errorf("trust domain %q: %w", fields[0], err)
	}
	u, err := parseEndpointURL(fields[1])
	if err != nil {
		return Endpoint{}, fmt.Errorf("URL %q: %w", redact(fields[1]), err)
	}
	ep := Endpoint{TrustDomain: td, URL: u, Profile: ProfileHTTPSWeb}
	if len(fields) >= 3 {
		id, err := parseEndpointSPIFFEID(fields[2])
		if err != nil {
			return Endpoint{}, fmt.Errorf("endpoint SPIFFE ID %q: %w", fields[2], err)
		}
		ep.Profile = ProfileHTTPSSPIFFE
		ep.EndpointSPIFFEID = id
	}
	return ep, nil
}

// FormatEndpoints is the inverse of ParseEndpoints: it joins the endpoints'
// String forms with "||". Bootstrap bundles and refresh bounds are dropped.
func FormatEndpoints(eps []Endpoint) string {
	parts := make([]string, len(eps))
	for i, ep := range eps {
		parts[i] = ep.String()
	}
	return strings.Join(parts, "||")
}

// MergeEndpoints concatenates endpoint sets from several sources (the
// --federate flag, SPIFFE_BUNDLE_ENDPOINTS, the YAML file), in order. A
// trust domain configured twice is an error naming both entries by source
// index (0-based, in argument order), endpoint index and tuple form: picking
// one silently would let a typo redirect trust. Every endpoint is checked
// again, so hand-built values get the same guarantees as parsed ones.
func MergeEndpoints(sets ...[]Endpoint) ([]Endpoint, error) {
	var out []Endpoint
	seen := make(trustDomainSet)
	for si, set := range sets {
		for ei, ep := range set {
			where := fmt.Sprintf("source %d endpoint %d (%q)", si, ei, ep.String())
			err := ep.validate()
			if err == nil {
				err = seen.add(ep.TrustDomain, where)
			}
			if err != nil {
				return nil, fmt.Errorf("federation: %s: %w", where, err)
			}
			out = append(out, ep)
		}
	}
	return out, nil
}

// trustDomainSet remembers where each trust domain was configured, so a
// duplicate's error can point at the first entry too.
type trustDomainSet map[spiffeid.TrustDomain]string

func (s trustDomainSet) add(td spiffeid.TrustDomain, where string) error {
	if first, dup := s[td]; dup {
		return fmt.Errorf("trust domain %q is already configured by %s", td.Name(), first)
	}
	s[td] = where
	return nil
}

// parseTrustDomain accepts only a bare trust-domain name: the trust domain
// is never to be guessed from a SPIFFE ID or URL pasted into the wrong field
// (§7.2).
func parseTrustDomain(s string) (spiffeid.TrustDomain, error) {
	return bundledoc.TrustDomainName(s)
}

// asciiSpace is what is trimmed at tuple edges: the whitespace a shell or
// a multi-line YAML value adds. Unicode spaces (NBSP, U+2028) are not
// trimmed; they make the tuple invalid instead of silently vanishing.
const asciiSpace = " \t\r\n"

// userinfo matches the credentials part of a URL.
var userinfo = regexp.MustCompile(`(?i)([a-z][a-z0-9+.-]*://)[^/?#|@\s]*@`)

// redact hides URL credentials in text quoted back in errors and logs; a
// refused URL with a password must not leak it into log aggregation.
func redact(s string) string {
	return userinfo.ReplaceAllString(s, "${1}REDACTED@")
}

// parseEndpointURL parses a bundle endpoint URL and applies the URL
// requirements of §5.2.1.1 and §5.2.2.1 plus a few of our own.
func parseEndpointURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("is empty")
	}
	// url.Parse lets through characters RFC 3986 forbids (spaces, '|', '"',
	// non-ASCII...). Refusing them catches stray whitespace and keeps every
	// accepted URL printable in the "|"-separated form.
	for _, r := range s {
		if !isURIChar(r) {
			return nil, fmt.Errorf("contains %q, which a URL cannot hold unencoded", r)
		}
	}
	u, err := url.Parse(s)
	if err == nil && (u.Scheme == "" || (u.Opaque != "" && strings.Trim(u.Opaque, "0123456789") == "")) {
		// "host/path" or "host:port": say how to write it instead of a
		// puzzling "scheme must be https".
		return nil, fmt.Errorf("has no scheme; write it as https://%s", s)
	}
	if err != nil {
		// *url.Error repeats the whole input, which the caller already names.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, err
	}
	if err := checkEndpointURL(u, s); err != nil {
		return nil, err
	}
	return u, nil
}

// checkEndpointURL checks a parsed URL; raw is its text, needed because
// url.Parse forgets a bare trailing "#".
func checkEndpointURL(u *url.URL, raw string) error {
	switch {
	case u.Scheme != "https":
		return errors.New("scheme must be https")
	case u.Opaque != "":
		return errors.New(`must be an absolute URL with a host ("https://host/path"), not an opaque URL`)
	case u.User != nil:
		return errors.New("must not contain userinfo")
	case strings.Contains(raw, "#"):
		// A fragment is never sent to the server; accepting one would
		// suggest it selects something.
		return errors.New("must not contain a fragment")
	case u.Hostname() == "":
		return errors.New("host is missing")
	case strings.HasSuffix(u.Host, ":"):
		return errors.New("port is empty")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("port %q is not a number from 1 to 65535", p)
		}
	}
	return nil
}

// isURIChar reports whether r may appear in a URI (RFC 3986 §2: unreserved,
// reserved and '%').
func isURIChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("-._~:/?#[]@!$&'()*+,;=%", r)
}

// parseEndpointSPIFFEID parses the SPIFFE ID an https_spiffe server must
// present.
func parseEndpointSPIFFEID(s string) (spiffeid.ID, error) {
	if s == "" {
		return spiffeid.ID{}, errors.New("is empty")
	}
	id, err := spiffeid.FromString(s)
	if err != nil {
		return spiffeid.ID{}, err
	}
	if err := checkEndpointSPIFFEID(id); err != nil {
		return spiffeid.ID{}, err
	}
	return id, nil
}

func checkEndpointSPIFFEID(id spiffeid.ID) error {
	if id.IsZero() {
		return errors.New("is missing")
	}
	if id.Path() == "" {
		// X509-SVID §2: a leaf SVID's ID has a non-root path, so no server
		// could ever present this ID and every fetch would fail.
		return errors.New("has no path: an X509-SVID never carries a trust domain's root ID, so no endpoint server could match it")
	}
	return nil
}

// checkProfile checks that the endpoint SPIFFE ID is there exactly when the
// profile needs it.
func checkProfile(p Profile, id spiffeid.ID) error {
	switch p {
	case ProfileHTTPSWeb:
		if !id.IsZero() {
			return errors.New("https_web takes no endpoint SPIFFE ID")
		}
		return nil
	case ProfileHTTPSSPIFFE:
		if err := checkEndpointSPIFFEID(id); err != nil {
			return fmt.Errorf("endpoint SPIFFE ID %w", err)
		}
		return nil
	default:
		return fmt.Errorf("profile %q is not one of %s, %s", p, ProfileHTTPSWeb, ProfileHTTPSSPIFFE)
	}
}

// Bounds on per-endpoint refresh settings: below a second a peer would be
// polled in a hot loop; above 30 days a revoked key would linger for a month.
const (
	minRefreshBound = time.Second
	maxRefreshBound = 30 * 24 * time.Hour
)

// checkRefresh checks refresh bounds; zero means "server default".
func checkRefresh(r Refresh) error {
	for _, v := range []struct {
		name string
		d    time.Duration
	}{{"min", r.Min}, {"max", r.Max}} {
		if v.d > 0 && (v.d < minRefreshBound || v.d > maxRefreshBound) {
			return fmt.Errorf("refresh %s %s is outside %s to %s", v.name, v.d, minRefreshBound, maxRefreshBound)
		}
	}
	switch {
	case r.Min < 0:
		return fmt.Errorf("refresh min %s is negative", r.Min)
	case r.Max < 0:
		return fmt.Errorf("refresh max %s is negative", r.Max)
	case r.Min > 0 && r.Max > 0 && r.Min > r.Max:
		return fmt.Errorf("refresh min %s is greater than max %s", r.Min, r.Max)
	}
	return nil
}

// checkBootstrap checks the bootstrap bundle against the endpoint it seeds.
func checkBootstrap(e Endpoint) error {
	b := e.BootstrapBundle
	if b == nil {
		return nil
	}
	if b.TrustDomain() != e.TrustDomain {
		// Never let one trust domain's keys stand for another's (§4.2, §7.3).
		return fmt.Errorf("bootstrap bundle is for trust domain %q, not %q", b.TrustDomain().Name(), e.TrustDomain.Name())
	}
	if e.Profile == ProfileHTTPSSPIFFE && e.EndpointSPIFFEID.MemberOf(e.TrustDomain) && len(b.X509Authorities()) == 0 {
		return fmt.Errorf("bootstrap bundle has no X.509 authorities, so it could never authenticate the first fetch from self-serving endpoint %s", e.EndpointSPIFFEID)
	}
	return nil
}

// validate checks an Endpoint value that may have been built by hand.
func (e Endpoint) validate() error {
	if e.TrustDomain.IsZero() {
		return errors.New("trust domain is missing")
	}
	if e.URL == nil {
		return errors.New("URL is missing")
	}
	// Round-trip through the text form so hand-built URLs meet exactly the
	// rules parsed ones do.
	if _, err := parseEndpointURL(e.URL.String()); err != nil {
		return fmt.Errorf("URL %q: %w", e.URL.String(), err)
	}
	if err := checkProfile(e.Profile, e.EndpointSPIFFEID); err != nil {
		return err
	}
	if err := checkRefresh(e.Refresh); err != nil {
		return err
	}
	return checkBootstrap(e)
}
