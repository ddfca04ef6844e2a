package jwtsvid

import (
	"errors"
	"fmt"
	"net/netip"
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
	if err := checkIssuerAuthority(s, u); err != nil {
		return nil, fmt.Errorf("issuer %q: %w", s, err)
	}
	if err := checkIssuerHost(u); err != nil {
		return nil, fmt.Errorf("issuer %q: %w", s, err)
	}
	if err := checkIssuerPath(s, u); err != nil {
		return nil, fmt.Errorf("issuer %q: %w", s, err)
	}
	return u, nil
}

// checkIssuerAuthority checks the scheme and port of issuer s (parsed as
// u) and that it has no user info, query or fragment. Only the canonical
// form is accepted: relying parties compare iss byte for byte with what
// they were configured with, so "HTTPS://a" or "https://a:443" would be
// another issuer to them than "https://a".
func checkIssuerAuthority(s string, u *url.URL) error {
	switch {
	case u.Scheme != "https":
		return errors.New("scheme must be https (relying parties fetch its discovery document with Web PKI)")
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return errors.New("has no host; write https://HOST[:PORT][/PATH]")
	case !strings.HasPrefix(s, "https://"):
		return errors.New(`write the scheme as "https://", lowercase`)
	case u.User != nil:
		return errors.New("must not carry user info")
	case u.RawQuery != "" || u.ForceQuery:
		return errors.New("must not have a query (OIDC Discovery §2)")
	case u.Fragment != "":
		return errors.New("must not have a fragment (OIDC Discovery §2)")
	}
	return checkIssuerPort(u)
}

// checkIssuerPort accepts no port or a canonical one other than 443.
func checkIssuerPort(u *url.URL) error {
	port := u.Port()
	if port == "" {
		if strings.HasSuffix(u.Host, ":") {
			return fmt.Errorf("empty port; write https://%s", strings.TrimSuffix(u.Host, ":"))
		}
		return nil
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || port[0] == '0' {
		return fmt.Errorf("port %q is not a port number as written canonically", port)
	}
	if port == "443" {
		return fmt.Errorf("port 443 is https's own; write https://%s without it", u.Hostname())
	}
	return nil
}

// checkIssuerHost accepts a DNS name of lowercase letters, digits and
// hyphens in dot-separated labels (no wildcard, no trailing dot) or an IP
// address literal without a zone: a host relying parties can reach and
// compare.
func checkIssuerHost(u *url.URL) error {
	host := u.Hostname()
	if strings.HasPrefix(u.Host, "[") {
		if ip, err := netip.ParseAddr(host); err != nil || !ip.Is6() || ip.Zone() != "" {
			return fmt.Errorf("host %q is not an IPv6 address without a zone", host)
		}
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !ip.Is4() {
			return fmt.Errorf("host %q: write an IPv6 address in brackets", host)
		}
		return nil
	}
	if len(host) > 253 {
		return fmt.Errorf("host of %d bytes is not a DNS name", len(host))
	}
	for _, label := range strings.Split(host, ".") {
		if !dnsLabel(label) {
			return fmt.Errorf("host %q is not a DNS name of lowercase letters, digits and hyphens (label %q; no wildcard, no trailing dot)", host, label)
		}
	}
	return nil
}

func dnsLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// checkIssuerPath checks the path of issuer s (parsed as u): clean, plain
// and without a trailing slash.
func checkIssuerPath(s string, u *url.URL) error {
	switch {
	case strings.Contains(s, "#"):
		return errors.New("must not have a fragment (OIDC Discovery §2)")
	case strings.HasSuffix(s, "/"):
		return fmt.Errorf("ends with \"/\"; relying parties compare iss exactly, so write %q", strings.TrimRight(s, "/"))
	case strings.ContainsAny(u.Path, "{}"):
		return errors.New("path must not contain { or }")
	case u.RawPath != "" || strings.Contains(u.Path, "%"):
		return errors.New("path must not be percent-encoded")
	case u.Path != "" && path.Clean(u.Path) != u.Path:
		return errors.New("path is not clean (no //, /./ or /../)")
	}
	return nil
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
		return fmt.Errorf("%w: iss %q is not %s's issuer %q", ErrInvalidToken, fmt.Sprint(got), svid.ID.TrustDomain().Name(), want)
	}
	return nil
}
