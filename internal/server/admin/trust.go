package admin

import "github.com/trustbridge/trustbridge/internal/server/api"

// Trust is GET /v1/trust: the CA's published bundle, its roots, its JWT
// signing keys with their rotation state and the OIDC issuers served.
func (h *Handler) Trust() api.Trust {
	b := h.cfg.CA.Bundle()
	doc := api.NewTrust(h.cfg.TrustDomain, b, h.cfg.CA.Roots(), h.localJWTAuthorities(b))
	doc.OIDCIssuers = h.oidcIssuers()
	return doc
}

// oidcIssuers are the OIDC issuers of JWT-SVIDs the server names, read
// now; nil without any.
func (h *Handler) oidcIssuers() []api.OIDCIssuer {
	if h.cfg.JWTIssuers == nil {
		return nil
	}
	return api.NewOIDCIssuers(h.cfg.JWTIssuers())
}
