package api

import (
	"time"

	"github.com/trustbridge/trustbridge/internal/authn/oidc"
)

// Issuers is GET /v1/authn/issuers: the OIDC and remote Kubernetes
// issuers whose tokens authenticate callers.
type Issuers struct {
	Issuers []Issuer `json:"issuers"`
}

// Issuer is one OIDC or remote Kubernetes issuer: what it is, and the
// state of its keys.
type Issuer struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Issuer string `json:"issuer"`
	// Keys is how many keys are held; 0 means its tokens are refused
	// (Unavailable) until a fetch succeeds.
	Keys        int        `json:"keys"`
	LastFetch   *time.Time `json:"last_fetch,omitempty"`
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// LastError is the last fetch's error, "" when it succeeded.
	LastError string `json:"last_error,omitempty"`
}

// NewIssuers is GET /v1/authn/issuers of sts.
func NewIssuers(sts []oidc.IssuerStatus) Issuers {
	out := Issuers{Issuers: make([]Issuer, 0, len(sts))}
	for _, s := range sts {
		out.Issuers = append(out.Issuers, Issuer{
			Name: s.Name, Kind: string(s.Kind), Issuer: s.Issuer, Keys: s.Keys,
			LastFetch: optTime(s.LastFetch), LastSuccess: optTime(s.LastSuccess), LastError: s.LastError,
		})
	}
	return out
}
