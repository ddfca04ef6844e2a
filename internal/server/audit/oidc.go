package audit

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Finding codes of the OIDC issuers the server serves (--jwt-issuer,
// --relay-jwt-issuer). Relying parties (AWS, GCP, Azure, Vault) fetch an
// issuer's discovery document and JWKS over Web PKI TLS, and trust its
// JWT-SVIDs only through them.
const (
	// CodeOIDCHostNotCovered: the serving certificate is not valid for
	// the issuer's host, so every relying party fails the TLS handshake.
	CodeOIDCHostNotCovered = "oidc_issuer_host_not_covered"
	// CodeOIDCKeyWithoutUse: a key of the JWKS served has no "use".
	CodeOIDCKeyWithoutUse = "oidc_key_without_use"
	// CodeOIDCNoKey: the discovery endpoint serves no key (503).
	CodeOIDCNoKey = "oidc_issuer_no_key"
)

// oidcFindings judges each issuer the server serves; one a relay serves
// (ServedHere false) is the relay's to judge.
func oidcFindings(s api.Snapshot) []api.Finding {
	var out []api.Finding
	for _, iss := range s.OIDCIssuers {
		if !iss.ServedHere {
			continue
		}
		if f, ok := oidcHostFinding(iss); ok {
			out = append(out, f)
		}
		if len(iss.Keys) == 0 {
			out = append(out, oidcNoKeyFinding(iss))
		}
		for _, k := range iss.Keys {
			if k.Use == "" {
				out = append(out, api.Finding{Severity: api.SeverityWarning, Code: CodeOIDCKeyWithoutUse, TrustDomain: iss.TrustDomain,
					Message: fmt.Sprintf("key %q of OIDC issuer %s has no \"use\" in its JWKS (%s): relying parties that pick verification keys by \"use\": \"sig\" skip it, and refuse the JWT-SVIDs it signed", k.KID, iss.URL, iss.JWKSURL),
					Fix:     fmt.Sprintf("the JWKS this snapshot records for %s lacks \"use\", which trustbridge's bundle endpoint always sets to \"sig\": the snapshot comes from a server that does not; upgrade it (this check reads what the server renders, not what a proxy or CDN in front of it may rewrite: compare with curl %s)", iss.JWKSURL, iss.JWKSURL)})
			}
		}
	}
	return out
}

// oidcHostFinding is the finding of an issuer whose host the serving
// certificate does not cover.
func oidcHostFinding(iss api.OIDCIssuer) (api.Finding, bool) {
	c := iss.Certificate
	if c == nil || c.CoversHost {
		return api.Finding{}, false
	}
	host := issuerHost(iss.URL)
	names := strings.Join(c.Names, ", ")
	if names == "" {
		names = "no name"
	}
	fix := fmt.Sprintf("reissue --bundle-tls-cert with %s as a subject alternative name (the endpoint reloads the file when it changes), or set --jwt-issuer/--relay-jwt-issuer to a URL on a host the certificate covers and restart", hostSAN(host))
	if c.ACME {
		fix = fmt.Sprintf("add --acme-domain %s and restart, so the ACME certificate covers it", host)
	}
	msg := fmt.Sprintf("the bundle endpoint's certificate (valid for %s) does not cover host %s of OIDC issuer %s of %s: relying parties fail the TLS handshake fetching its discovery document, and refuse its JWT-SVIDs", names, host, iss.URL, iss.TrustDomain)
	if c.Reason != "" {
		msg += " (" + c.Reason + ")"
	}
	return api.Finding{Severity: api.SeverityWarning, Code: CodeOIDCHostNotCovered, TrustDomain: iss.TrustDomain, Message: msg, Fix: fix}, true
}

// oidcNoKeyFinding is the finding of an issuer whose discovery document
// and JWKS answer 503: no JWT authority of its trust domain can be
// published.
func oidcNoKeyFinding(iss api.OIDCIssuer) api.Finding {
	msg := fmt.Sprintf("OIDC issuer %s of %s serves no key: %s answers 503, so relying parties refuse every JWT-SVID whose iss is %s", iss.URL, iss.TrustDomain, iss.DiscoveryURL, iss.URL)
	if iss.Error != "" {
		msg += ": " + iss.Error
	}
	fix := "publish a JWT authority relying parties take in our bundle: the CA's own keys (see the jwt_* findings and GET /v1/trust's jwt_authorities; --jwt-key-type ES256, the default, ES384 or RS256), or in static mode one in the --bundle-file FILE; " +
		"if this server mints no JWT-SVIDs, drop --jwt-issuer"
	if !iss.Local {
		fix = fmt.Sprintf("the relayed bundle of %s (--bundle-file %s=FILE) has no JWT authority relying parties take (EC P-256/P-384/P-521, RSA of 2048 bits or more, Ed25519): ask %s's operators for a bundle that carries their JWT authorities, or remove --relay-jwt-issuer %s=%s",
			iss.TrustDomain, iss.TrustDomain, iss.TrustDomain, iss.TrustDomain, iss.URL)
	}
	return api.Finding{Severity: api.SeverityWarning, Code: CodeOIDCNoKey, TrustDomain: iss.TrustDomain, Message: msg, Fix: fix}
}

// issuerHost is the host of an issuer URL, or the URL when it has none.
func issuerHost(issuer string) string {
	if u, err := url.Parse(issuer); err == nil && u.Hostname() != "" {
		return u.Hostname()
	}
	return issuer
}

// hostSAN names host as the subject alternative name that covers it.
func hostSAN(host string) string {
	if net.ParseIP(host) != nil {
		return "IP address " + host
	}
	return "DNS name " + host
}
