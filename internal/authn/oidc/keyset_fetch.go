package oidc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pquerna/cachecontrol/cacheobject"

	"github.com/trustbridge/trustbridge/internal/netutil"
)

// Limits of one key fetch (the discovery document, then the key set).
const (
	// An issuer's configuration is a few KiB and its key set a few keys
	// of a few hundred bytes; larger answers are errors, not truncated.
	maxDiscoveryBytes = 64 << 10
	maxJWKSBytes      = 256 << 10
	maxKeyHeaderBytes = 64 << 10
	keyFetchTimeout   = 5 * time.Second
	maxKeyRedirects   = 3
	// allowPrivateKey is the configuration key that opens loopback and
	// link-local addresses, named in refusals.
	allowPrivateKey = "allowPrivateAddresses"
)

// newKeyClient returns the client of one issuer's key fetches: TLS 1.2
// or later against roots (nil: the system's), no proxy (the dial guard
// must see the real peer), no keep-alives (nothing outlives a fetch),
// redirects only to https and through the same dial guard.
func newKeyClient(roots *x509.CertPool, allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Control: netutil.DialControl(allowPrivate, allowPrivateKey), Timeout: keyFetchTimeout}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                  nil,
			DialContext:            dialer.DialContext,
			TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots},
			TLSHandshakeTimeout:    keyFetchTimeout,
			ResponseHeaderTimeout:  keyFetchTimeout,
			DisableKeepAlives:      true,
			MaxResponseHeaderBytes: maxKeyHeaderBytes,
		},
		CheckRedirect: checkKeyRedirect,
		Timeout:       keyFetchTimeout,
	}
}

// checkKeyRedirect follows at most maxKeyRedirects redirects, to https
// URLs without userinfo only.
func checkKeyRedirect(req *http.Request, via []*http.Request) error {
	u := req.URL
	switch {
	case len(via) > maxKeyRedirects:
		return fmt.Errorf("redirect to %s refused: more than %d redirects", u.Redacted(), maxKeyRedirects)
	case u.Scheme != "https":
		return fmt.Errorf("redirect to %s refused: scheme must be https", u.Redacted())
	case u.User != nil:
		return fmt.Errorf("redirect to %s refused: must not contain userinfo", u.Redacted())
	case u.Hostname() == "":
		return fmt.Errorf("redirect to %s refused: host is missing", u.Redacted())
	}
	return nil
}

// get GETs u and returns the body of a 200 answer of at most limit bytes.
func (k *keySet) get(ctx context.Context, u string, limit int64) ([]byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", u, err)
	}
	// kube-apiserver answers its JWKS only to a client that accepts
	// RFC 7517's media type (406 otherwise); other issuers send JSON.
	req.Header.Set("Accept", "application/json, application/jwk-set+json")
	resp, err := k.cfg.client.Do(req)
	if err != nil {
		// url.Error repeats method and URL.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET %s: HTTP status %s, want 200 OK", u, resp.Status)
	}
	body, err := readCapped(resp.Body, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", u, err)
	}
	return body, resp.Header, nil
}

// readCapped reads all of r, failing past limit bytes.
func readCapped(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("response body larger than %d bytes", limit)
	}
	return b, nil
}

// parseDiscovery reads an OpenID configuration served for issuer and
// returns its jwks_uri. Its issuer must be the configured one exactly
// (OpenID Connect Discovery §4.3), so a host serving several issuers, or
// a redirect, cannot make one issuer's keys stand for another's.
func parseDiscovery(body []byte, issuer string) (string, error) {
	var doc struct {
		Issuer  *string `json:"issuer"`
		JWKSURI *string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", fmt.Errorf("openid configuration: %w", err)
	}
	switch {
	case doc.Issuer == nil:
		return "", errors.New("openid configuration has no issuer")
	case *doc.Issuer != issuer:
		return "", fmt.Errorf("openid configuration names issuer %q, not %q as configured: they must be identical (OpenID Connect Discovery 1.0 §4.3)",
			clipRemote(*doc.Issuer, 256), issuer)
	case doc.JWKSURI == nil || *doc.JWKSURI == "":
		return "", errors.New("openid configuration has no jwks_uri")
	}
	u, err := url.Parse(*doc.JWKSURI)
	switch {
	case err != nil:
		return "", fmt.Errorf("openid configuration jwks_uri: %w", err)
	case u.Scheme != "https":
		return "", fmt.Errorf("openid configuration jwks_uri %q: scheme must be https", clipRemote(u.Redacted(), 256))
	case u.User != nil:
		return "", fmt.Errorf("openid configuration jwks_uri %q: must not contain userinfo", clipRemote(u.Redacted(), 256))
	case u.Hostname() == "":
		return "", fmt.Errorf("openid configuration jwks_uri %q: host is missing", clipRemote(u.Redacted(), 256))
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String(), nil
}

// clipRemote bounds a string from a remote document or a token quoted
// in an error.
func clipRemote(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// keysFreshFor is how long a key set answered with header h may be used
// before the next use fetches it again: the header's freshness lifetime
// minus the Age already spent (RFC 9111 §4.2), clamped to
// [least, maxKeyFreshness]. least is the refresh interval, so no header
// can make fetches more frequent than unknown kids may.
func keysFreshFor(h http.Header, now time.Time, least time.Duration) time.Duration {
	return min(max(headerFreshness(h, now), least), maxKeyFreshness)
}

// headerFreshness is the remaining freshness lifetime h gives, or
// defaultKeyFreshness when it gives none. trustbridge is a private cache
// of one client, so s-maxage and private do not apply. The directives are
// parsed by cachecontrol's cacheobject; its higher-level API is not used
// since it reads the wall clock, ignores Age and guesses a lifetime from
// Last-Modified.
func headerFreshness(h http.Header, now time.Time) time.Duration {
	cc, err := cacheobject.ParseResponseCacheControl(strings.Join(h.Values("Cache-Control"), ", "))
	if err != nil {
		return defaultKeyFreshness
	}
	age := headerAge(h.Get("Age"))
	switch {
	case cc.NoStore || cc.NoCachePresent:
		return 0
	case cc.MaxAge >= 0:
		return time.Duration(cc.MaxAge)*time.Second - age
	case h.Get("Expires") != "":
		exp, err := http.ParseTime(h.Get("Expires"))
		if err != nil {
			return 0 // RFC 9111 §5.3: an invalid date means already expired
		}
		date, err := http.ParseTime(h.Get("Date"))
		if err != nil {
			date = now
		}
		return exp.Sub(date) - age
	}
	return defaultKeyFreshness
}

// headerAge reads an Age header; anything but delta-seconds is ignored
// (RFC 9111 §5.1).
func headerAge(v string) time.Duration {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
	if err != nil {
		return 0
	}
	return time.Duration(n) * time.Second
}
