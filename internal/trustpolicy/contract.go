package trustpolicy

// CONTRACT (session 27): the exported API below is what the sds, crd and
// cmd work codes against. The helper owning internal/trustpolicy replaces
// these bodies (and this file) with real implementations in their own
// files, keeping the names and signatures.

import (
	"errors"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
)

var errTODO = errors.New("trustpolicy: not implemented yet")

// LabelSource returns the labels of a Kubernetes service account, and a
// channel closed when any labels change; nil when unknown.
type LabelSource interface {
	Labels(namespace, name string) map[string]string
	Changed() <-chan struct{}
}

// Access decides for authenticated callers (sds.AccessPolicy).
type Access struct{}

// Decide returns ident's decision under the current policy and a channel
// closed when it may have changed.
func (a *Access) Decide(ident authn.Identity) (Decision, <-chan struct{}) {
	return Decision{}, nil
}

// SubjectOf is the Subject of an authenticated identity: its SPIFFE ID,
// and the service account it proved (token, or the grant recorded in its
// X509-SVID).
func SubjectOf(ident authn.Identity) Subject { return Subject{ID: ident.ID} }

// Explanation is what `trustbridge policy explain` prints: for every trust
// domain the server trusts, whether the subject receives it, with which
// peers, and which rule (or the default) decided.
type Explanation struct {
	Subject      string
	Default      Default
	Matched      []Match
	TrustDomains []ExplainedTrustDomain
}

// ExplainedTrustDomain is one trust domain of an Explanation.
type ExplainedTrustDomain struct {
	TrustDomain string
	Trusted     bool
	Peers       []string // empty: every member
	Because     string   // "rule <name> (<origin>)", "default allow", "governed; no rule grants it", "local trust domain"
}

// Explain explains d for the given trust domains.
func Explain(d Decision, sub Subject, tds []spiffeid.TrustDomain) Explanation {
	return Explanation{Subject: sub.ID.String()}
}
