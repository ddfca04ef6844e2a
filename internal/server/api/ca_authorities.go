package api

import (
	"encoding/hex"
	"time"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
)

// CAAuthorities is GET /v1/ca/authorities: the local CA's signing
// authorities as `trustbridge ca authority list` shows them, with what
// each signed that is still valid.
type CAAuthorities struct {
	TrustDomain string `json:"trust_domain"`
	// Sequence is the published bundle's spiffe_sequence.
	Sequence uint64 `json:"sequence"`
	// SignedSince is since when the Signed counts run (this replica's
	// start: what was signed before is not counted); nil when the server
	// does not count what its authorities sign.
	SignedSince *time.Time `json:"signed_since,omitempty"`
	// X509 are the roots or, in upstream mode, the intermediates the
	// upstream signed; JWT the JWT-SVID signing keys. Revoked ones are
	// listed until they expire.
	X509 []CAAuthority `json:"x509"`
	JWT  []CAAuthority `json:"jwt"`
}

// Kinds of CAAuthority.
const (
	CAKindRoot         = "root"
	CAKindIntermediate = "intermediate"
	CAKindJWT          = "jwt"
)

// CAAuthority is one of the local CA's signing authorities: an X.509
// root or upstream-signed intermediate, or a JWT signing key.
type CAAuthority struct {
	// ID is a root's or intermediate's ID (hex serial), a JWT key's kid:
	// what `trustbridge ca authority` takes.
	ID string `json:"id"`
	// Kind is CAKindRoot, CAKindIntermediate or CAKindJWT.
	Kind string `json:"kind"`
	// State is prepared, active, retired or revoked.
	State string `json:"state"`
	// Upstream names the upstream that signed an intermediate.
	Upstream string `json:"upstream,omitempty"`
	// Algorithm is the JWS algorithm a JWT key signs with.
	Algorithm string `json:"algorithm,omitempty"`
	// SubjectKeyID is an X.509 authority's subject key identifier (hex):
	// the authority key identifier of what it signed.
	SubjectKeyID string `json:"subject_key_id,omitempty"`
	// SHA256 is of the certificate DER for X.509, of the
	// SubjectPublicKeyInfo DER for JWT keys.
	SHA256 string `json:"sha256"`

	PreparedAt  *time.Time `json:"prepared_at,omitempty"`
	PublishedAt *time.Time `json:"published_at,omitempty"`
	// ActivatesAt is, for a prepared authority that was published, the
	// earliest it signs on its own: PublishedAt plus ca.PublishLead
	// refresh hints, or its MinActivateAt when later. `activate --now`
	// makes it sign before.
	ActivatesAt *time.Time `json:"activates_at,omitempty"`
	ActivatedAt *time.Time `json:"activated_at,omitempty"`
	RetiredAt   *time.Time `json:"retired_at,omitempty"`
	RemoveAfter *time.Time `json:"remove_after,omitempty"`
	// TaintedAt is when an operator tainted it: clients re-issue what it
	// signed, and it signs nothing more. RevokedAt is when it was revoked:
	// it left the bundle, and peers refuse it.
	TaintedAt *time.Time `json:"tainted_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	NotAfter  *time.Time `json:"not_after,omitempty"`

	// Signed counts what it signed that is still valid, since
	// CAAuthorities.SignedSince; nil when the server does not count.
	Signed *SignedCount `json:"signed,omitempty"`
}

// SignedCount is what one authority signed that is still valid.
type SignedCount struct {
	// Live counts the X509-SVIDs or JWT-SVIDs it signed that have not
	// expired.
	Live int `json:"live"`
	// InUse counts those of Live that no newer one for the same workload
	// superseded: what workloads still present. Revoking the authority
	// fails them until they re-issue.
	InUse int `json:"in_use"`
	// Last is when the last of Live expires.
	Last time.Time `json:"last,omitzero"`
	// Incomplete, when set, says why the counts may miss some of what the
	// authority signed: it signed before this replica started counting,
	// other replicas sign too, or the ledger was full. Zero in use then
	// proves nothing, and revoke needs --force.
	Incomplete string `json:"incomplete,omitempty"`
}

// SignedKey is the key of an authority's SignedCount in the map the
// issuance ledger reports: "x509:<subject key id hex>" for an X.509
// authority (the authority key identifier of the leaves it signed),
// "jwt:<kid>" for a JWT key.
func SignedKey(a CAAuthority) string {
	if a.Kind == CAKindJWT {
		return "jwt:" + a.ID
	}
	return "x509:" + a.SubjectKeyID
}

// BundleFetcher is a client of our bundle endpoint, as the endpoint
// records it: by LastFetch it had been served Sequence.
type BundleFetcher struct {
	// Client is its IP address (a load balancer's, behind one: the
	// endpoint does not trust X-Forwarded-For); UserAgent what it said it
	// is, sanitised and cut to 64 characters.
	Client    string    `json:"client"`
	UserAgent string    `json:"user_agent,omitempty"`
	LastFetch time.Time `json:"last_fetch"`
	// Sequence is the spiffe_sequence of the document last served to it.
	Sequence uint64 `json:"sequence"`
}

// CAAuthorityChange is the body of POST /v1/ca/authorities.
type CAAuthorityChange struct {
	// Action is prepare, activate, taint or revoke.
	Action string `json:"action"`
	// JWT selects the JWT signing keys; false the X.509 authorities.
	JWT bool `json:"jwt,omitempty"`
	// ID names the authority (CAAuthority.ID); prepare takes none, and
	// activate without one takes the prepared one.
	ID string `json:"id,omitempty"`
	// Now, with activate, makes the authority sign at once rather than at
	// its ActivatesAt.
	Now bool `json:"now,omitempty"`
	// Force, with revoke, revokes an authority whose certificates
	// workloads still present.
	Force bool `json:"force,omitempty"`
}

// CAAuthorityResult answers POST /v1/ca/authorities.
type CAAuthorityResult struct {
	// Authority is the authority after the change.
	Authority CAAuthority `json:"authority"`
	// Message says what happened, on one line for a human.
	Message string `json:"message"`
	// Warnings are what the operator must know: after activate, the peers
	// that may not hold the authority yet.
	Warnings []string `json:"warnings,omitempty"`
	// NotSeen are, after activate, the clients of our bundle endpoint
	// whose last fetch predates the authority's publication.
	NotSeen []BundleFetcher `json:"not_seen,omitempty"`
}

// RootCAAuthority is the CA's root or intermediate r. hint is the
// published bundle's refresh hint, for ActivatesAt.
func RootCAAuthority(r ca.RootInfo, hint time.Duration) CAAuthority {
	kind := CAKindRoot
	a := CAAuthority{ID: r.ID, State: string(r.State), SHA256: r.CertSHA256,
		PreparedAt: optTime(r.PreparedAt), PublishedAt: optTime(r.PublishedAt),
		ActivatedAt: optTime(r.ActivatedAt), RetiredAt: optTime(r.RetiredAt), RemoveAfter: optTime(r.RemoveAfter),
		TaintedAt: optTime(r.TaintedAt), RevokedAt: optTime(r.RevokedAt),
	}
	if r.Upstream != nil {
		kind, a.Upstream = CAKindIntermediate, r.Upstream.Name
	}
	a.Kind = kind
	if r.Cert != nil {
		a.SubjectKeyID = hex.EncodeToString(r.Cert.SubjectKeyId)
		a.NotAfter = optTime(r.Cert.NotAfter)
		if a.SHA256 == "" {
			a.SHA256 = X509Authority(r.Cert).SHA256
		}
	}
	if r.State == castate.StatePrepared {
		a.ActivatesAt = optTime(activatesAt(r.PublishedAt, r.MinActivateAt, hint))
	}
	return a
}

// JWTCAAuthority is the CA's JWT signing key k (hint as for
// RootCAAuthority).
func JWTCAAuthority(k ca.JWTKeyInfo, hint time.Duration) CAAuthority {
	a := CAAuthority{ID: k.KID, Kind: CAKindJWT, State: string(k.State), Algorithm: k.Algorithm,
		SHA256:     SPKISHA256(k.Public),
		PreparedAt: optTime(k.PreparedAt), PublishedAt: optTime(k.PublishedAt),
		ActivatedAt: optTime(k.ActivatedAt), RetiredAt: optTime(k.RetiredAt), RemoveAfter: optTime(k.RemoveAfter),
		TaintedAt: optTime(k.TaintedAt), RevokedAt: optTime(k.RevokedAt), NotAfter: optTime(k.NotAfter),
	}
	if k.State == castate.StatePrepared {
		a.ActivatesAt = optTime(activatesAt(k.PublishedAt, k.MinActivateAt, hint))
	}
	return a
}

// activatesAt is when a prepared authority published at published signs
// on its own, as the CA computes it; zero while it is unpublished.
func activatesAt(published, minActivate time.Time, hint time.Duration) time.Time {
	if published.IsZero() {
		return time.Time{}
	}
	at := published.Add(ca.PublishLead * hint)
	if minActivate.After(at) {
		return minActivate
	}
	return at
}

// BundleFetchers is GET /v1/bundle/fetchers: the clients of our bundle
// endpoint that fetched the local trust domain's bundle, as the endpoint
// records them (bounded, in memory: since this replica started).
type BundleFetchers struct {
	TrustDomain string          `json:"trust_domain"`
	Fetchers    []BundleFetcher `json:"fetchers"`
}
