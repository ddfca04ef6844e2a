package admin

import "time"

// Trust is the answer of GET /v1/trust: the CA's published bundle.
type Trust struct {
	TrustDomain        string           `json:"trust_domain"`
	Sequence           uint64           `json:"sequence"`
	RefreshHintSeconds int64            `json:"refresh_hint_seconds"`
	Authorities        []TrustAuthority `json:"authorities"`
	// JWTAuthorities are the bundle's JWT authorities: the CA's signing
	// keys with their rotation state when the CA reports them.
	JWTAuthorities []TrustJWTAuthority `json:"jwt_authorities"`
}

// TrustAuthority is one of the CA's roots and its rotation state.
type TrustAuthority struct {
	ID          string     `json:"id"`
	State       string     `json:"state"`
	SHA256      string     `json:"sha256"`
	Subject     string     `json:"subject"`
	NotBefore   time.Time  `json:"not_before"`
	NotAfter    time.Time  `json:"not_after"`
	PreparedAt  time.Time  `json:"prepared_at"`
	ActivatedAt *time.Time `json:"activated_at,omitempty"`
	RetiredAt   *time.Time `json:"retired_at,omitempty"`
	RemoveAfter *time.Time `json:"remove_after,omitempty"`
}

// Trust reports the CA's published bundle.
func (h *Handler) Trust() Trust {
	b := h.cfg.CA.Bundle()
	seq, _ := b.SequenceNumber()
	hint, _ := b.RefreshHint()
	doc := Trust{TrustDomain: h.cfg.TrustDomain.Name(), Sequence: seq, RefreshHintSeconds: int64(hint / time.Second), Authorities: []TrustAuthority{}}
	for _, r := range h.cfg.CA.Roots() {
		doc.Authorities = append(doc.Authorities, TrustAuthority{
			ID: r.ID, State: string(r.State), SHA256: r.CertSHA256, Subject: r.Cert.Subject.String(),
			NotBefore: r.Cert.NotBefore.UTC(), NotAfter: r.Cert.NotAfter.UTC(), PreparedAt: r.PreparedAt.UTC(),
			ActivatedAt: optTime(r.ActivatedAt), RetiredAt: optTime(r.RetiredAt), RemoveAfter: optTime(r.RemoveAfter),
		})
	}
	doc.JWTAuthorities = h.trustJWTAuthorities(b)
	return doc
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
