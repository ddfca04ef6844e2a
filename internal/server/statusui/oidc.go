package statusui

import (
	"strings"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// issuerRow is one OIDC issuer of JWT-SVIDs the server names.
type issuerRow struct {
	URL, DiscoveryURL, JWKSURL string
	TrustDomain                string
	// Whose is "ours" or "relayed"; Served says where its documents are
	// served, and State/StateClass sum it up as a badge.
	Whose, Served     string
	State, StateClass string
	ServedHere        bool
	Keys              []issuerKey
	// Cert is the serving certificate's names; CertCovers whether they
	// cover the issuer's host, CertReason why not.
	Cert       string
	CertCovers bool
	CertReason string
	Error      string
}

type issuerKey struct {
	KID, Alg, Use string
}

// issuerRowsOf is the OIDC issuers panel; nil hides it.
func issuerRowsOf(s api.Snapshot) []issuerRow {
	var rows []issuerRow
	for _, iss := range s.OIDCIssuers {
		row := issuerRow{
			URL: iss.URL, DiscoveryURL: iss.DiscoveryURL, JWKSURL: iss.JWKSURL, TrustDomain: iss.TrustDomain,
			Whose: "relayed", Served: "by this server", ServedHere: iss.ServedHere, Error: iss.Error,
		}
		if iss.Local {
			row.Whose = "ours"
		}
		for _, k := range iss.Keys {
			row.Keys = append(row.Keys, issuerKey{KID: k.KID, Alg: k.Algorithm, Use: k.Use})
		}
		if c := iss.Certificate; c != nil {
			row.Cert, row.CertCovers, row.CertReason = strings.Join(c.Names, ", "), c.CoversHost, c.Reason
			if c.ACME {
				row.Cert += " (ACME)"
			}
		}
		row.State, row.StateClass = issuerState(iss)
		if !iss.ServedHere {
			row.Served = "by a relay (bundle endpoint off here)"
		}
		rows = append(rows, row)
	}
	return rows
}

// issuerState is the issuer's badge: classes from a fixed set, as
// tdState's.
func issuerState(iss api.OIDCIssuer) (text, class string) {
	switch {
	case !iss.ServedHere:
		return "relay", "external"
	case len(iss.Keys) == 0:
		return "no key", "failing"
	case iss.Certificate != nil && !iss.Certificate.CoversHost:
		return "host not covered", "failing"
	}
	for _, k := range iss.Keys {
		if k.Use == "" {
			return "key without use", "stale"
		}
	}
	return "serving", "ok"
}
