package federation

import "github.com/spiffe/go-spiffe/v2/spiffeid"

// EventKind names a trust change.
type EventKind string

// Event kinds.
const (
	EventEndpointAdded   EventKind = "endpoint_added"
	EventEndpointRemoved EventKind = "endpoint_removed"
	EventEndpointChanged EventKind = "endpoint_changed"
	// EventBundleAccepted: a new or changed bundle was applied (not an
	// unchanged one, not a 304).
	EventBundleAccepted EventKind = "bundle_accepted"
	// EventBundleRejected: a bundle was fetched but refused (Accept's
	// verdict, a foreign trust domain's roots). Fetches that failed before
	// a bundle arrived are not trust changes and have no event.
	EventBundleRejected EventKind = "bundle_rejected"
)

// Event is one trust change, for the audit log.
type Event struct {
	Kind        EventKind
	TrustDomain spiffeid.TrustDomain
	EndpointURL string
	// OldSequence is the held bundle's sequence before the change,
	// NewSequence the fetched (rejected) or applied one; nil when none.
	OldSequence, NewSequence *uint64
	// Added and Removed are the authorities the change added and removed
	// (an added endpoint's restored bundle; a removed endpoint's last one).
	Added, Removed []Fingerprint
	// Reason is what changed (endpoint_changed: "url", "profile", ...) or
	// the refusal kind (bundle_rejected: "sequence_regression", ...).
	Reason string
	// Err is why a bundle was rejected.
	Err error
}
