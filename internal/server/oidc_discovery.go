package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

// issuerFlagNames name the issuer flags in errors.
const (
	flagJWTIssuer      = "--jwt-issuer"
	flagRelayJWTIssuer = "--relay-jwt-issuer"
)

// configuredIssuer is one issuer the bundle endpoint serves, named by the
// flag value it came from.
type configuredIssuer struct {
	bundleserver.Issuer
	flag  string // "--jwt-issuer URL" or "--relay-jwt-issuer TD=URL"
	local bool   // ours (--jwt-issuer), not a relayed trust domain's
}

// oidcIssuers are the issuers the bundle endpoint serves: ours
// (--jwt-issuer) and the relayed trust domains' (--relay-jwt-issuer
// TD=URL). It refuses what would serve an issuer clouds cannot use or
// that is not ours to serve, before anything starts.
func oidcIssuers(b BundleConfig, jwtIssuer string, td spiffeid.TrustDomain) ([]configuredIssuer, error) {
	var out []configuredIssuer
	if jwtIssuer != "" {
		if _, err := jwtsvid.ParseIssuer(jwtIssuer); err != nil {
			return nil, fmt.Errorf("%s: %w", flagJWTIssuer, err)
		}
		if b.Listen != "" {
			if b.Profile != ProfileWeb {
				return nil, fmt.Errorf("%s %q needs --bundle-profile https_web: clouds and Vault fetch the issuer's discovery document with Web PKI, which the https_spiffe certificate is not; "+
					"serve the bundle endpoint with https_web (--bundle-tls-cert/--bundle-tls-key or --acme-domain), or serve the issuer from a relay (docs/oidc-discovery.md) and set --bundle-listen=\"\" here", flagJWTIssuer, jwtIssuer)
			}
			out = append(out, configuredIssuer{bundleserver.Issuer{URL: jwtIssuer, TrustDomain: td}, flagJWTIssuer + " " + jwtIssuer, true})
		}
	}
	relayed := RelayedTrustDomains(b)
	for _, spec := range b.RelayIssuers {
		iss, err := relayIssuer(spec, b, td, relayed)
		if err != nil {
			return nil, err
		}
		out = append(out, iss)
	}
	urls := make([]string, len(out))
	for i, a := range out {
		for _, b := range out[:i] {
			if a.TrustDomain == b.TrustDomain {
				return nil, fmt.Errorf("%s: %s already has issuer %s", a.flag, a.TrustDomain.Name(), b.URL)
			}
		}
		urls[i] = a.URL
	}
	if err := bundleserver.CheckIssuerPaths(b.Path, urls); err != nil {
		return nil, fmt.Errorf("%s and %s on the bundle endpoint: %w; give each issuer a path of its own, apart from --bundle-path", flagJWTIssuer, flagRelayJWTIssuer, err)
	}
	return out, nil
}

// relayIssuer parses a --relay-jwt-issuer TD=URL: a trust domain relayed
// from a bundle file (--bundle-file TD=FILE), served on an https_web
// bundle endpoint.
func relayIssuer(spec string, b BundleConfig, td spiffeid.TrustDomain, relayed []spiffeid.TrustDomain) (configuredIssuer, error) {
	name, url, found := strings.Cut(spec, "=")
	flag := fmt.Sprintf("%s %q", flagRelayJWTIssuer, spec)
	if !found {
		return configuredIssuer{}, fmt.Errorf("%s: want TD=URL, such as prod.example=https://oidc.example.com/prod", flag)
	}
	rtd, err := spiffeid.TrustDomainFromString(name)
	if err != nil {
		return configuredIssuer{}, fmt.Errorf("%s: trust domain %q: %w", flag, name, err)
	}
	if _, err := jwtsvid.ParseIssuer(url); err != nil {
		return configuredIssuer{}, fmt.Errorf("%s: %w", flag, err)
	}
	switch {
	case rtd == td:
		return configuredIssuer{}, fmt.Errorf("%s: %s is our own trust domain; its issuer is %s", flag, td.Name(), flagJWTIssuer)
	case b.Listen == "":
		return configuredIssuer{}, fmt.Errorf("%s: the bundle endpoint is off (--bundle-listen=\"\"), so nothing would serve it", flag)
	case b.Profile != ProfileWeb:
		return configuredIssuer{}, fmt.Errorf("%s needs --bundle-profile https_web: relying parties fetch the discovery document with Web PKI", flag)
	case !slices.Contains(relayed, rtd):
		return configuredIssuer{}, fmt.Errorf("%s: %s is not relayed from a bundle file (--bundle-file %s=FILE); only our own and relayed trust domains are served as issuers, never a federated peer's", flag, rtd.Name(), rtd.Name())
	}
	return configuredIssuer{Issuer: bundleserver.Issuer{URL: url, TrustDomain: rtd}, flag: flag}, nil
}

// setupIssuers finds the issuers the endpoint serves, checks that the
// serving certificate getCert covers their hosts, and returns them as
// the bundle server takes them.
func (ep *bundleEndpoint) setupIssuers(o BundleConfig, jwtIssuer string, td spiffeid.TrustDomain,
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) ([]bundleserver.Issuer, error) {
	var err error
	if ep.issuers, err = oidcIssuers(o, jwtIssuer, td); err != nil {
		return nil, err
	}
	ep.getCert = getCert
	if err := ep.checkIssuerHosts(ep.issuers, o.ACMEDomains); err != nil {
		return nil, err
	}
	issuers := make([]bundleserver.Issuer, len(ep.issuers))
	for i, iss := range ep.issuers {
		issuers[i] = iss.Issuer
	}
	return issuers, nil
}

// issuerHost is the host name (or IP) of an issuer URL that ParseIssuer
// accepted.
func issuerHost(issuer string) string {
	u, err := jwtsvid.ParseIssuer(issuer)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// certCovers reports whether cert is valid for host (a DNS name or an IP
// address), as a relying party's TLS client would check it.
func certCovers(cert *tls.Certificate, host string) error {
	if cert == nil || cert.Leaf == nil {
		return errors.New("no certificate loaded")
	}
	return cert.Leaf.VerifyHostname(host)
}

// certNames lists what cert is valid for, for error messages.
func certNames(cert *tls.Certificate) string {
	names := certNameList(cert)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// certNameList is cert's DNS names, then its IP addresses; nil without a
// certificate.
func certNameList(cert *tls.Certificate) []string {
	if cert == nil || cert.Leaf == nil {
		return nil
	}
	names := slices.Clone(cert.Leaf.DNSNames)
	for _, ip := range cert.Leaf.IPAddresses {
		names = append(names, ip.String())
	}
	return names
}

// checkIssuerHosts refuses issuers whose host the serving certificate
// does not cover: a relying party would fail the TLS handshake of the
// discovery fetch, with nothing in our logs. With ACME the names are the
// --acme-domain ones; with files, the certificate loaded now (a reload
// that drops the name is reported by trustbridge audit).
func (ep *bundleEndpoint) checkIssuerHosts(issuers []configuredIssuer, acmeDomains []string) error {
	for _, iss := range issuers {
		host := issuerHost(iss.URL)
		if len(acmeDomains) > 0 {
			if !slices.ContainsFunc(acmeDomains, func(d string) bool { return strings.EqualFold(d, host) }) {
				return fmt.Errorf("%s: host %s is not among the --acme-domain names (%s): relying parties fetch the discovery document over TLS for %s; add --acme-domain %s",
					iss.flag, host, strings.Join(acmeDomains, ", "), host, host)
			}
			continue
		}
		cert := ep.webCert()
		if err := certCovers(cert, host); err != nil {
			return fmt.Errorf("%s: host %s is not covered by --bundle-tls-cert (valid for %s): relying parties fetch the discovery document over TLS for %s; reissue the certificate with %s as a subject alternative name",
				iss.flag, host, certNames(cert), host, hostKind(host))
		}
	}
	return nil
}

func hostKind(host string) string {
	if net.ParseIP(host) != nil {
		return "IP address " + host
	}
	return "DNS name " + host
}

// checkIssuerCertificate runs checkIssuerHosts on the flags alone, before
// any state exists: the --bundle-tls-cert file is read once here.
func checkIssuerCertificate(b BundleConfig, jwtIssuer string, td spiffeid.TrustDomain) error {
	issuers, err := oidcIssuers(b, jwtIssuer, td)
	if err != nil || len(issuers) == 0 {
		return err
	}
	ep := &bundleEndpoint{}
	if len(b.ACMEDomains) == 0 && b.TLSCert != "" && b.TLSKey != "" {
		fc := bundleserver.NewFileCertificate(b.TLSCert, b.TLSKey, clock.RealClock{}, nil)
		if err := fc.Load(); err != nil {
			return err
		}
		ep.getCert = fc.GetCertificate
	}
	return ep.checkIssuerHosts(issuers, b.ACMEDomains)
}

// webCert is the serving certificate now, nil when there is none.
func (ep *bundleEndpoint) webCert() *tls.Certificate {
	if ep.getCert == nil {
		return nil
	}
	c, err := ep.getCert(&tls.ClientHelloInfo{})
	if err != nil {
		return nil
	}
	return c
}
