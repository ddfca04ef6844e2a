package agent

import (
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// jwtIssuerCell holds the issuer (iss) the server names, on its
// WatchBundles messages, for its trust domain's JWT-SVIDs, so that the
// Workload API's ValidateJWTSVID refuses a token of that trust domain
// carrying another. Every message sets it: a server restarted without
// --jwt-issuer clears it.
type jwtIssuerCell struct {
	v atomic.Pointer[jwtIssuer]
}

type jwtIssuer struct {
	td  spiffeid.TrustDomain
	iss string
}

func (c *jwtIssuerCell) set(td spiffeid.TrustDomain, iss string) {
	if c == nil {
		return
	}
	if cur := c.v.Load(); cur != nil && cur.td == td && cur.iss == iss {
		return
	}
	c.v.Store(&jwtIssuer{td: td, iss: iss})
}

// of is jwtsvid.IssuerOf: the issuer of td's JWT-SVIDs, "" when the
// server named none for it.
func (c *jwtIssuerCell) of(td spiffeid.TrustDomain) string {
	if cur := c.v.Load(); cur != nil && cur.td == td {
		return cur.iss
	}
	return ""
}
