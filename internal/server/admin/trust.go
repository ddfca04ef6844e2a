package admin

import "github.com/trustbridge/trustbridge/internal/server/api"

// Trust is GET /v1/trust: the CA's published bundle, its roots and its JWT
// signing keys with their rotation state.
func (h *Handler) Trust() api.Trust {
	b := h.cfg.CA.Bundle()
	return api.NewTrust(h.cfg.TrustDomain, b, h.cfg.CA.Roots(), h.localJWTAuthorities(b))
}
