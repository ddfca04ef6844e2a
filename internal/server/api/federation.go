package api

import (
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/federation"
)

// FederationStatus is one entry of GET /v1/federation: a trust domain
// whose bundle the server holds besides its own, with where it comes
// from, its polling state when an endpoint is polled for it, and the
// authorities of the bundle held. The pointers are null until known
// (never polled, no hint given).
type FederationStatus struct {
	TrustDomain      string `json:"trust_domain"`
	EndpointURL      string `json:"endpoint_url"`
	Profile          string `json:"profile"` // https_web or https_spiffe
	EndpointSPIFFEID string `json:"endpoint_spiffe_id,omitempty"`
	// Origin says where the trust domain is configured: for a polled
	// endpoint "flag", "file", "runtime" or "crd:<resource name>"; for a
	// bundle held as set, OriginStatic (bundle set) or
	// "bundle-file:<path>" (--bundle-file TD=FILE). SourceLabel words it.
	Origin string `json:"origin,omitempty"`
	// Held says what the bundle of a polled endpoint is: "fetched"
	// (served by the endpoint, or restored from the last-known-good
	// store), "bootstrap" (the operator's, not yet confirmed by a fetch)
	// or "" (none held).
	Held                string     `json:"held,omitempty"`
	State               string     `json:"state"` // pending, ok, failing, stale; StateStatic when not polled
	Sequence            *uint64    `json:"sequence"`
	RefreshHintSeconds  *int64     `json:"refresh_hint_seconds"`
	LastAttempt         *time.Time `json:"last_attempt"`
	LastSuccess         *time.Time `json:"last_success"`
	LastError           string     `json:"last_error,omitempty"`
	NextRefresh         *time.Time `json:"next_refresh"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	// Refusals counts failed and refused polls since the process started,
	// by kind (the trustbridge_federation_fetches_total result label).
	Refusals    map[string]uint64     `json:"refusals,omitempty"`
	Authorities []FederationAuthority `json:"authorities"`
}

// FederationAuthority is one authority of a held bundle.
type FederationAuthority struct {
	Kind     string     `json:"kind"` // KindX509, KindJWT or KindWIT
	SHA256   string     `json:"sha256"`
	Subject  string     `json:"subject,omitempty"`
	KeyID    string     `json:"key_id,omitempty"`
	NotAfter *time.Time `json:"not_after,omitempty"`
}

// NewFederationStatus is st as GET /v1/federation shows it, with where
// its endpoint is configured (origin).
func NewFederationStatus(st federation.Status, origin string) FederationStatus {
	return FederationStatus{
		TrustDomain: st.TrustDomain, EndpointURL: st.EndpointURL, Profile: string(st.Profile),
		EndpointSPIFFEID: st.EndpointSPIFFEID, Origin: origin, Held: st.Held, State: string(st.State), Sequence: st.Sequence,
		RefreshHintSeconds: st.RefreshHintSeconds, LastAttempt: st.LastAttempt, LastSuccess: st.LastSuccess,
		LastError: st.LastError, NextRefresh: st.NextRefresh, ConsecutiveFailures: st.ConsecutiveFailures,
		Refusals: st.Refusals, Authorities: federationAuthorities(st.Authorities),
	}
}

// NewHeldStatus is a bundle held as set, not polled (bundle set, a
// bundle file), as GET /v1/federation shows it, with where it comes from
// (origin: OriginStatic, or OriginBundleFile and the file's path).
func NewHeldStatus(b *spiffebundle.Bundle, origin string) FederationStatus {
	out := FederationStatus{TrustDomain: b.TrustDomain().Name(), Origin: origin, State: StateStatic,
		Sequence: federation.SequenceOf(b), Authorities: federationAuthorities(federation.AuthorityInfos(b))}
	if h, ok := b.RefreshHint(); ok {
		secs := int64(h / time.Second)
		out.RefreshHintSeconds = &secs
	}
	return out
}

func federationAuthorities(infos []federation.AuthorityInfo) []FederationAuthority {
	out := make([]FederationAuthority, 0, len(infos))
	for _, a := range infos {
		out = append(out, FederationAuthority{Kind: string(a.Kind), SHA256: a.SHA256,
			Subject: a.Subject, KeyID: a.KeyID, NotAfter: a.NotAfter})
	}
	return out
}

// SourceLabel words where a held bundle comes from, for people (the
// federation status table, /ui): origin and held as FederationStatus
// carries them.
func SourceLabel(origin, held string) string {
	switch {
	case origin == OriginStatic:
		return "set at run time by bundle set"
	case strings.HasPrefix(origin, OriginBundleFile+":"):
		return "bundle file " + strings.TrimPrefix(origin, OriginBundleFile+":")
	}
	var what string
	switch held {
	case federation.HeldFetched:
		what = "fetched"
	case federation.HeldBootstrap:
		what = "bootstrap bundle, not yet fetched"
	default:
		what = "nothing fetched yet"
	}
	if by := configuredBy(origin); by != "" {
		return what + " (" + by + ")"
	}
	return what
}

// configuredBy words where a polled endpoint is configured.
func configuredBy(origin string) string {
	switch {
	case origin == "flag":
		return "--federate"
	case origin == "file":
		return "--federation-config"
	case origin == "runtime":
		return "federation add"
	case strings.HasPrefix(origin, "crd:"):
		return "resource " + strings.TrimPrefix(origin, "crd:")
	}
	return origin
}

// Federation is the polling state of a federated trust domain as the
// snapshot shows it on the trust domain (whose sequence and authorities
// are the trust domain's own), with where it is configured.
type Federation struct {
	EndpointURL      string `json:"endpoint_url"`
	Profile          string `json:"profile"` // https_web or https_spiffe
	EndpointSPIFFEID string `json:"endpoint_spiffe_id,omitempty"`
	// Origin says where the relationship is configured: "flag", "file",
	// or "crd:<ClusterFederatedTrustDomain name>".
	Origin              string     `json:"origin,omitempty"`
	State               string     `json:"state"` // pending, ok, failing, stale
	LastAttempt         *time.Time `json:"last_attempt,omitempty"`
	LastSuccess         *time.Time `json:"last_success,omitempty"`
	NextRefresh         *time.Time `json:"next_refresh,omitempty"`
	LastError           string     `json:"last_error,omitempty"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	RefreshHintSeconds  *int64     `json:"refresh_hint_seconds,omitempty"`
	// Refusals counts failed or refused polls since the process started,
	// by kind ("sequence_regression", "profile_mismatch",
	// "trust_domain_mismatch", "tls", "timeout", ...).
	Refusals map[string]uint64 `json:"refusals,omitempty"`
}

// NewFederation is st as the snapshot shows it on its trust domain, with
// where the relationship is configured (origin).
func NewFederation(st federation.Status, origin string) *Federation {
	return &Federation{
		EndpointURL: st.EndpointURL, Profile: string(st.Profile), EndpointSPIFFEID: st.EndpointSPIFFEID,
		Origin: origin, State: string(st.State),
		LastAttempt: st.LastAttempt, LastSuccess: st.LastSuccess, NextRefresh: st.NextRefresh,
		LastError: st.LastError, ConsecutiveFailures: st.ConsecutiveFailures,
		RefreshHintSeconds: st.RefreshHintSeconds, Refusals: st.Refusals,
	}
}

// Relationship is one entry of GET /v1/federation/relationships: a trust
// domain federated by an endpoint, or trusted by a static bundle.
type Relationship struct {
	TrustDomain      string `json:"trust_domain"`
	Origin           string `json:"origin"`
	EndpointURL      string `json:"endpoint_url,omitempty"`
	Profile          string `json:"profile,omitempty"`
	EndpointSPIFFEID string `json:"endpoint_spiffe_id,omitempty"`
	State            string `json:"state,omitempty"`
}

// OriginStatic is the origin of a trust domain trusted by a static
// bundle (bundle set).
const OriginStatic = "static"

// OriginBundleFile prefixes the origin of a trust domain relayed from a
// bundle file (--bundle-file TD=FILE): "bundle-file:<path>".
const OriginBundleFile = "bundle-file"

// StateStatic is the state of a trust domain whose bundle is held as set
// (bundle set, a bundle file), not polled: nothing can fail or go stale.
const StateStatic = "static"

// NewRelationship is st as GET /v1/federation/relationships shows it,
// with where it is configured (origin).
func NewRelationship(st federation.Status, origin string) Relationship {
	return Relationship{TrustDomain: st.TrustDomain, Origin: origin, EndpointURL: st.EndpointURL,
		Profile: string(st.Profile), EndpointSPIFFEID: st.EndpointSPIFFEID, State: string(st.State)}
}

// RelationshipPatch is the body of PATCH
// /v1/federation/relationships/{trust_domain} (federation update): the
// fields given change, the others keep their value. Profile is
// "https_web" or "https_spiffe"; an EndpointSPIFFEID alone makes the
// relationship https_spiffe. TrustDomainBundle is a SPIFFE bundle document
// or PEM CA certificates, the new bootstrap bundle.
type RelationshipPatch struct {
	EndpointURL       *string `json:"endpoint_url,omitempty"`
	Profile           *string `json:"profile,omitempty"`
	EndpointSPIFFEID  *string `json:"endpoint_spiffe_id,omitempty"`
	TrustDomainBundle *string `json:"trust_domain_bundle,omitempty"`
}
