package agent

import (
	"log/slog"
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// jwtIssuerCell holds the issuer (iss) the server names, on its
// WatchBundles messages, for its trust domain's JWT-SVIDs, so that the
// Workload API's ValidateJWTSVID refuses a token of that trust domain
// carrying another. Every message sets it: a server restarted without
// --jwt-issuer clears it.
type jwtIssuerCell struct {
	v atomic.Pointer[jwtIssuer]
	// lastErr is the last unreadable issuer's problem, logged once.
	lastErr atomic.Pointer[string]
}

type jwtIssuer struct {
	td  spiffeid.TrustDomain
	iss string
}

// take sets the issuer a WatchBundles message names for td; one whose
// issuer did not parse keeps the issuer held, and says so once per
// distinct problem (log may be nil).
func (c *jwtIssuerCell) take(td spiffeid.TrustDomain, b *caclient.Bundles, log *slog.Logger) {
	if c == nil {
		return
	}
	if b.JWTIssuerErr != nil {
		msg := b.JWTIssuerErr.Error()
		if prev := c.lastErr.Swap(&msg); prev == nil || *prev != msg {
			if log != nil {
				log.Warn("the server names a JWT issuer this agent cannot read; keeping the one it had for ValidateJWTSVID", logattr.Error, msg)
			}
		}
		return
	}
	c.lastErr.Store(nil)
	c.set(td, b.JWTIssuer)
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
