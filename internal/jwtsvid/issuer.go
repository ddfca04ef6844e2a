package jwtsvid

import (
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
)

// MaxIssuerBytes bounds an issuer URL: relying parties copy it into their
// configuration (AWS allows 255 characters for an OIDC provider URL).
const MaxIssuerBytes = 255

// IssuerOf names the issuer (the iss claim) of a trust domain's JWT-SVIDs,
// "" where none is known: its tokens' iss is then not checked.
type IssuerOf func(spiffeid.TrustDomain) string

// ParseIssuer checks an OIDC issuer identifier (OpenID Connect Discovery
// 1.0 §2, §4): an https URL with a host, an optional port and path, and
// no user info, query or fragment. A trailing slash is refused: relying
// parties compare iss byte for byte, and "https://a/" is not "https://a",
// which is the most common reason a cloud refuses a token. It returns the
// URL parsed; the issuer is s itself, unchanged.
func ParseIssuer(s string) (*url.URL, error) {
	switch {
	case s == "":
		return nil, fmt.Errorf("issuer is empty; give an https URL such as https://oidc.example.com")
	case len(s) > MaxIssuerBytes:
		return nil, fmt.Errorf("issuer of %d bytes is over the %d-byte limit", len(s), MaxIssuerBytes)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f }); i >= 0 {
		return nil, fmt.Errorf("issuer %q: character %q at byte %d; an issuer is a plain https URL", s, s[i], i)
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("issuer %q: %w", s, err)
	}
	switch {
	case u.Scheme != "https":
		return nil, fmt.Errorf("issuer %q: scheme must be https (relying parties fetch its discovery document with Web PKI)", s)
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("issuer %q: has no host; write https://HOST[:PORT][/PATH]", s)
	case u.User != nil:
		return nil, fmt.Errorf("issuer %q: must not carry user info", s)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("issuer %q: must not have a query (OIDC Discovery §2)", s)
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, fmt.Errorf("issuer %q: must not have a fragment (OIDC Discovery §2)", s)
	case strings.HasSuffix(s, "/"):
		return nil, fmt.Errorf("issuer %q: ends with \"/\"; relying parties compare iss exactly, so write %q", s, strings.TrimRight(s, "/"))
	case strings.ContainsAny(u.Path, "{}"):
		return nil, fmt.Errorf("issuer %q: path must not contain { or }", s)
	case u.RawPath != "" || strings.Contains(u.Path, "%"):
		return nil, fmt.Errorf("issuer %q: path must not be percent-encoded", s)
	case u.Path != "" && path.Clean(u.Path) != u.Path:
		return nil, fmt.Errorf("issuer %q: path is not clean (no //, /./ or /../)", s)
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("issuer %q: port %q is not a port number", s, port)
		}
	}
	return u, nil
}

// checkIssuer refuses svid when its trust domain's issuer is known and
// its iss claim names another. A token without iss is accepted: it was
// minted before the issuer was configured and lives no longer than the
// longest JWT-SVID lifetime; its signature is what makes it ours.
func checkIssuer(svid *spiffejwt.SVID, issuer IssuerOf) error {
	if issuer == nil {
		return nil
	}
	want := issuer(svid.ID.TrustDomain())
	if want == "" {
		return nil
	}
	got, present := svid.Claims["iss"]
	if !present {
		return nil
	}
	if s, ok := got.(string); !ok || s != want {
		return fmt.Errorf("%w: iss %v is not %s's issuer %q", ErrInvalidToken, got, svid.ID.TrustDomain().Name(), want)
	}
	return nil
}
