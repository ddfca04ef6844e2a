package api

import (
	"slices"

	"github.com/trustbridge/trustbridge/bundleserver"
)

// OIDCIssuer is an OIDC issuer of JWT-SVIDs this server names: ours
// (--jwt-issuer, the iss of the tokens our CA mints) or a relayed trust
// domain's (--relay-jwt-issuer), with what its discovery document and
// JWKS serve now. It is in /v1/trust and the snapshot's oidc_issuers, so
// that `trustbridge audit` judges it offline.
type OIDCIssuer struct {
	URL         string `json:"url"`
	TrustDomain string `json:"trust_domain"`
	// Local is true for our own trust domain's issuer, false for a
	// relayed one's.
	Local bool `json:"local"`
	// ServedHere is false when our tokens carry the issuer but this
	// server's bundle endpoint is off: a relay serves its documents, and
	// Keys and Certificate say nothing of them.
	ServedHere   bool   `json:"served_here"`
	DiscoveryURL string `json:"discovery_url"`
	JWKSURL      string `json:"jwks_url"`
	// Keys are those the JWKS serves now, as a relying party reads them;
	// none while it answers 503 (no publishable JWT authority).
	Keys []OIDCIssuerKey `json:"keys"`
	// Algorithms are the discovery document's
	// id_token_signing_alg_values_supported.
	Algorithms []string `json:"algorithms"`
	// Certificate is the bundle endpoint's serving certificate as it
	// stands for the issuer's host; nil when not served here.
	Certificate *OIDCIssuerCertificate `json:"certificate,omitempty"`
	// Error is why not every JWT authority of the trust domain is
	// published, or why the JWKS could not be read; "" when all are.
	Error string `json:"error,omitempty"`
}

// OIDCIssuerKey is one key of an issuer's JWKS. Use is "" when the JWKS
// leaves it out.
type OIDCIssuerKey struct {
	KID       string `json:"kid"`
	Algorithm string `json:"alg,omitempty"`
	Use       string `json:"use,omitempty"`
}

// OIDCIssuerCertificate is the serving certificate checked against the
// issuer's host, as a relying party's TLS client checks it.
type OIDCIssuerCertificate struct {
	// Names are its DNS names and IP addresses; with ACME, the
	// --acme-domain names it is obtained for.
	Names []string `json:"names"`
	ACME  bool     `json:"acme,omitempty"`
	// CoversHost is whether the issuer's host is among them; Reason says
	// why not.
	CoversHost bool   `json:"covers_host"`
	Reason     string `json:"reason,omitempty"`
}

// OIDCIssuerStatus is what the server gathers of one issuer, as plain
// values: the bundle server's state of it, with Keys replaced by those
// its JWKS document serves (parsed from the bytes it serves), and the
// serving certificate's check. NewOIDCIssuer maps it.
type OIDCIssuerStatus struct {
	bundleserver.IssuerState
	Local, ServedHere bool
	// CertNames are what the certificate is valid for; CertErr why it
	// does not cover the issuer's host (nil: it does). Both unset when
	// not served here.
	CertNames []string
	ACME      bool
	CertErr   error
}

// NewOIDCIssuer is st on the wire.
func NewOIDCIssuer(st OIDCIssuerStatus) OIDCIssuer {
	out := OIDCIssuer{
		URL: st.URL, TrustDomain: st.TrustDomain.Name(), Local: st.Local, ServedHere: st.ServedHere,
		DiscoveryURL: st.DiscoveryURL, JWKSURL: st.JWKSURL,
		Keys: []OIDCIssuerKey{}, Algorithms: slices.Clone(st.Algorithms),
	}
	if out.Algorithms == nil {
		out.Algorithms = []string{}
	}
	for _, k := range st.Keys {
		out.Keys = append(out.Keys, OIDCIssuerKey{KID: k.KeyID, Algorithm: k.Algorithm, Use: k.Use})
	}
	if st.ServedHere {
		c := &OIDCIssuerCertificate{Names: slices.Clone(st.CertNames), ACME: st.ACME, CoversHost: st.CertErr == nil}
		if c.Names == nil {
			c.Names = []string{}
		}
		if st.CertErr != nil {
			c.Reason = st.CertErr.Error()
		}
		out.Certificate = c
	}
	if st.Err != nil {
		out.Error = st.Err.Error()
	}
	return out
}

// NewOIDCIssuers maps each of sts, ours first, then the relayed ones in
// the order given; nil when there are none.
func NewOIDCIssuers(sts []OIDCIssuerStatus) []OIDCIssuer {
	var out []OIDCIssuer
	for _, st := range sts {
		out = append(out, NewOIDCIssuer(st))
	}
	slices.SortStableFunc(out, func(a, b OIDCIssuer) int {
		switch {
		case a.Local == b.Local:
			return 0
		case a.Local:
			return -1
		}
		return 1
	})
	return out
}
