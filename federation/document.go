package federation

import (
	"fmt"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// CheckDocument decides a bundle document exactly as the poller decides
// one fetched from td's bundle endpoint, with the same functions: it is
// what `trustbridge bundle inspect` runs, so that its exit status is the
// poller's verdict. The document must parse strictly as a bundle of td
// (bundledoc.Parse: exactly one use per key, no duplicate members, sizes,
// key strength...), no x5c certificate may name another trust domain
// (ErrTrustDomainMismatch), and Accept must take it over held: a bundle
// without X.509 or JWT authorities is refused unless allowEmpty
// (ErrEmptyBundle), and with a held bundle (nil: none, as before a first
// fetch) the sequence may not go back or change its keys
// (ErrSequenceRegression, ErrSequenceConflict). A document whose
// trustbridge_revoked member names an authority it carries is refused
// (ErrRevokedAuthority); the authorities earlier bundles revoked are the
// poller's to check, as only it holds them.
//
// Transport rules (status, Content-Type, size cap, TLS) are the fetcher's
// and do not apply to a document read from a file. Warnings are the
// elements the spec says to ignore, as the poller logs them.
func CheckDocument(td spiffeid.TrustDomain, doc []byte, held *spiffebundle.Bundle, allowEmpty bool) (*spiffebundle.Bundle, Decision, []bundledoc.Warning, error) {
	b, warnings, revs, err := parseDocument(td, doc)
	if err != nil {
		return nil, 0, warnings, fmt.Errorf("federation: %w", err)
	}
	if err := checkRevoked(td, b, revs, nil); err != nil {
		return nil, 0, warnings, err
	}
	dec, err := CheckBundle(held, b, warnings, allowEmpty)
	if err != nil {
		return nil, 0, warnings, err
	}
	return b, dec, warnings, nil
}

// parseDocument parses a fetched document as td's bundle, with the
// authorities it lists as revoked.
func parseDocument(td spiffeid.TrustDomain, doc []byte) (*spiffebundle.Bundle, []bundledoc.Warning, []bundledoc.Revocation, error) {
	b, warnings, err := bundledoc.Parse(td, doc)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", ErrBundle, err)
	}
	if b.TrustDomain() != td {
		return nil, nil, nil, fmt.Errorf("%w: parsed for trust domain %q, want %q", ErrBundle, b.TrustDomain().Name(), td.Name())
	}
	revs, err := bundledoc.ParseRevocations(doc)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", ErrBundle, err)
	}
	return b, warnings, revs, nil
}

// CheckBundle is the poller's verdict on a document already parsed as
// fetched's trust domain's bundle, with the warnings the parse gave: a
// warning that refuses the whole document (RefusedWarning) first, then
// Accept over held. CheckDocument is it after the parse; `bundle inspect`
// calls it on each entry of a bundle map.
func CheckBundle(held, fetched *spiffebundle.Bundle, warnings []bundledoc.Warning, allowEmpty bool) (Decision, error) {
	if err := RefusedWarning(warnings); err != nil {
		return 0, fmt.Errorf("federation: %w", err)
	}
	return Accept(held, fetched, allowEmpty)
}

// RefusedWarning returns an error wrapping ErrTrustDomainMismatch for the
// first warning that refuses a whole document rather than one element: an
// x5c certificate naming another trust domain. The endpoint (or the
// stored entry) serves a bundle whose roots belong to another trust
// domain, a misrouted URL or an attack: trusting it would let that
// domain's CA mint the peer's identities (§4.2, §7.3). Nil when there is
// none.
func RefusedWarning(warnings []bundledoc.Warning) error {
	for _, w := range warnings {
		if w.Code == bundledoc.CodeForeignTrustDomain {
			return fmt.Errorf("%w: %s", ErrTrustDomainMismatch, w.String())
		}
	}
	return nil
}
