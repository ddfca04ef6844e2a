package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// jwtIssuerStatuses is the admin API's view of the OIDC issuers the
// server names (admin.Config.JWTIssuers): each one the bundle endpoint
// serves, read at every call, or ours alone when the endpoint is off and
// a relay serves it. nil when there is none.
func jwtIssuerStatuses(jwtIssuer string, td spiffeid.TrustDomain, ep *bundleEndpoint) func() []api.OIDCIssuerStatus {
	if ep != nil && len(ep.issuers) > 0 {
		return ep.issuerStatuses
	}
	if jwtIssuer == "" {
		return nil
	}
	st := api.OIDCIssuerStatus{Local: true, IssuerState: bundleserver.IssuerState{
		URL: jwtIssuer, DiscoveryURL: jwtIssuer + bundleserver.DiscoveryPath, JWKSURL: jwtIssuer + bundleserver.JWKSPath, TrustDomain: td,
	}}
	return func() []api.OIDCIssuerStatus { return []api.OIDCIssuerStatus{st} }
}

// issuerStatuses are the issuers the endpoint serves now. Their keys are
// those of the JWKS as the endpoint answers it, not as we built it, and
// the serving certificate is checked now: a reloaded --bundle-tls-cert
// may have dropped an issuer's host.
func (ep *bundleEndpoint) issuerStatuses() []api.OIDCIssuerStatus {
	states := ep.endpoint.Server().IssuerStates()
	out := make([]api.OIDCIssuerStatus, 0, len(states))
	for i, st := range states {
		s := api.OIDCIssuerStatus{IssuerState: st, Local: i < len(ep.issuers) && ep.issuers[i].local, ServedHere: true}
		keys, err := ep.servedKeys(st)
		s.Keys = keys
		if err != nil {
			s.Err = errors.Join(st.Err, err)
		}
		s.CertNames, s.ACME, s.CertErr = ep.issuerCert(issuerHost(st.URL))
		out = append(out, s)
	}
	return out
}

// servedKeys reads st's JWKS document as the bundle server serves it
// (its bytes, parsed as a relying party parses them, rather than the key
// list it was rendered from) and returns its keys' kid, alg and use; none
// while it answers 503 (no JWT authority publishable: st.Err says why).
// What a proxy or CDN in front of the endpoint serves is not seen here.
func (ep *bundleEndpoint) servedKeys(st bundleserver.IssuerState) ([]bundleserver.IssuerKey, error) {
	if st.JWKS == nil {
		return nil, nil
	}
	var set struct {
		Keys []struct {
			KID string `json:"kid"`
			Alg string `json:"alg"`
			Use string `json:"use"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(st.JWKS, &set); err != nil {
		return nil, fmt.Errorf("%s: the JWKS is not JSON: %w", st.JWKSURL, err)
	}
	keys := make([]bundleserver.IssuerKey, 0, len(set.Keys))
	for _, k := range set.Keys {
		keys = append(keys, bundleserver.IssuerKey{KeyID: k.KID, Algorithm: k.Alg, Use: k.Use})
	}
	return keys, nil
}

// issuerCert checks the serving certificate against an issuer's host as
// checkIssuerHosts does at start: with ACME against the --acme-domain
// names, else the certificate served now. err says why it does not
// cover host.
func (ep *bundleEndpoint) issuerCert(host string) (names []string, acme bool, err error) {
	if len(ep.acmeDomains) > 0 {
		if !slices.ContainsFunc(ep.acmeDomains, func(d string) bool { return strings.EqualFold(d, host) }) {
			err = fmt.Errorf("host %s is not among the --acme-domain names", host)
		}
		return slices.Clone(ep.acmeDomains), true, err
	}
	cert := ep.webCert()
	return certNameList(cert), false, certCovers(cert, host)
}
