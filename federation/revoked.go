package federation

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// ErrRevokedAuthority: the fetched bundle carries, in "keys", an authority
// its trust domain revoked: one a bundle accepted earlier listed in
// bundledoc.RevokedMember, or one the bundle itself lists there.
var ErrRevokedAuthority = errors.New("bundle carries a revoked authority")

// maxHeldRevoked caps the revoked authorities held for one trust domain:
// the union over its bundles, each capped at bundledoc.MaxRevocations,
// less the entries past their exp. Past it the publisher revokes faster
// than its authorities expire, which no incident explains.
const maxHeldRevoked = 16 * bundledoc.MaxRevocations

// Revoked is an authority a trust domain's bundle endpoint listed as
// revoked, as this peer holds it (issue 38): a bundle that carries it
// again is refused until NotAfter, when the authority would have expired
// anyway.
type Revoked struct {
	bundledoc.Revocation
	// Sequence is the spiffe_sequence of the first accepted bundle that
	// listed it; nil when that bundle had none.
	Sequence *uint64
	// Since is when this peer accepted that bundle.
	Since time.Time
}

// listedRevoked is what an accepted bundle with sequence seq lists, as
// held from now.
func listedRevoked(revs []bundledoc.Revocation, seq *uint64, now time.Time) []Revoked {
	out := make([]Revoked, len(revs))
	for i, r := range revs {
		out[i] = Revoked{Revocation: r, Sequence: seq, Since: now.UTC()}
	}
	return out
}

// unionRevoked is held with more added, sorted by what each names: an
// authority held already keeps when and where it was first listed and
// takes the later NotAfter. changed says whether anything was added or
// extended. held is never modified (a relationship's set is shared with
// the entries it saved).
func unionRevoked(held, more []Revoked) (out []Revoked, changed bool) {
	byID := make(map[string]int, len(held))
	out = slices.Clone(held)
	for i, r := range out {
		byID[r.ID()] = i
	}
	for _, r := range more {
		i, ok := byID[r.ID()]
		switch {
		case !ok:
			byID[r.ID()] = len(out)
			out = append(out, r)
			changed = true
		case r.NotAfter.After(out[i].NotAfter):
			out[i].NotAfter = r.NotAfter
			changed = true
		}
	}
	if changed {
		slices.SortFunc(out, func(a, b Revoked) int { return cmp.Compare(a.ID(), b.ID()) })
	}
	return out, changed
}

// pruneRevoked is held without the entries past their NotAfter at now:
// nothing the authority signed is valid any more, so refusing it buys
// nothing.
func pruneRevoked(held []Revoked, now time.Time) []Revoked {
	if !slices.ContainsFunc(held, func(r Revoked) bool { return now.After(r.NotAfter) }) {
		return held
	}
	return slices.DeleteFunc(slices.Clone(held), func(r Revoked) bool { return now.After(r.NotAfter) })
}

// checkRevoked refuses b, a bundle of td listing own, when it carries an
// authority own or held names.
func checkRevoked(td spiffeid.TrustDomain, b *spiffebundle.Bundle, own []bundledoc.Revocation, held []Revoked) error {
	if r, ok := bundledoc.RevokedAuthority(b, own); ok {
		return fmt.Errorf("federation: accept: %w: the bundle lists %s in %s and carries it too; %s's publisher must remove it from \"keys\"",
			ErrRevokedAuthority, r, bundledoc.RevokedMember, td.Name())
	}
	h, ok := heldRevoked(b, held)
	if !ok {
		return nil
	}
	return fmt.Errorf("federation: accept: %w: %s; the bundle brings it back, so the publisher's state looks restored from before the revocation: its operators must revoke it again",
		ErrRevokedAuthority, h.describe(td))
}

// CheckRevoked refuses b, a bundle an operator gives for its trust domain
// (trustbridge bundle set), when it carries an authority of held, the
// revoked set the poller holds for that trust domain (Poller.Revoked).
func CheckRevoked(b *spiffebundle.Bundle, held []Revoked) error {
	h, ok := heldRevoked(b, held)
	if !ok {
		return nil
	}
	return fmt.Errorf("federation: %w: %s; take it out of the bundle", ErrRevokedAuthority, h.describe(b.TrustDomain()))
}

// heldRevoked is the entry of held naming an authority b carries.
func heldRevoked(b *spiffebundle.Bundle, held []Revoked) (Revoked, bool) {
	revs := make([]bundledoc.Revocation, len(held))
	for i, h := range held {
		revs[i] = h.Revocation
	}
	r, ok := bundledoc.RevokedAuthority(b, revs)
	if !ok {
		return Revoked{}, false
	}
	return held[slices.IndexFunc(held, func(h Revoked) bool { return h.ID() == r.ID() })], true
}

// withoutRevoked is b without the authorities held names (nil when none
// is left), and what it took out; b itself when it carries none. A
// bootstrap bundle is the operator's, often from before a revocation: it
// may still hold the root the trust domain revoked since, and trusting it
// again while the endpoint is down would undo the revocation.
func withoutRevoked(b *spiffebundle.Bundle, held []Revoked) (*spiffebundle.Bundle, []string) {
	if _, ok := heldRevoked(b, held); !ok {
		return b, nil
	}
	ids := map[string]bool{}
	for _, h := range held {
		ids[h.ID()] = true
	}
	out := b.Clone()
	var dropped []string
	for _, cert := range b.X509Authorities() {
		if r := (bundledoc.Revocation{Use: bundledoc.UseX509SVID, X5TS256: bundledoc.X509Thumbprint(cert)}); ids[r.ID()] {
			out.RemoveX509Authority(cert)
			dropped = append(dropped, r.String())
		}
	}
	for kid := range b.JWTAuthorities() {
		if r := (bundledoc.Revocation{Use: bundledoc.UseJWTSVID, KID: kid}); ids[r.ID()] {
			out.RemoveJWTAuthority(kid)
			dropped = append(dropped, r.String())
		}
	}
	slices.Sort(dropped)
	if out.Empty() {
		return nil, dropped
	}
	return out, dropped
}

// describe says what h is, who revoked it and when, for refusals.
func (h Revoked) describe(td spiffeid.TrustDomain) string {
	return fmt.Sprintf("%s was revoked by %s (listed since sequence %s, accepted here %s; refused until %s)",
		h.Revocation, td.Name(), seqPtrString(h.Sequence), h.Since.UTC().Format(time.RFC3339), h.NotAfter.UTC().Format(time.RFC3339))
}

func seqPtrString(s *uint64) string {
	if s == nil {
		return "unset"
	}
	return fmt.Sprint(*s)
}

// learnRevoked adds what an accepted bundle lists to held, refusing a set
// past maxHeldRevoked.
func learnRevoked(td spiffeid.TrustDomain, held []Revoked, revs []bundledoc.Revocation, seq *uint64, now time.Time) ([]Revoked, bool, error) {
	out, changed := unionRevoked(held, listedRevoked(revs, seq, now))
	if len(out) > maxHeldRevoked {
		return held, false, fmt.Errorf("federation: accept: %w: %s has listed %d revoked authorities that have not expired, more than the %d held; its publisher should list each only until it expires",
			ErrBundle, td.Name(), len(out), maxHeldRevoked)
	}
	return out, changed, nil
}

// revokedRecord is the stored form of Revoked in a last-known-good entry.
type revokedRecord struct {
	Use      string    `json:"use"`
	X5TS256  string    `json:"x5t#S256,omitempty"`
	KID      string    `json:"kid,omitempty"`
	Exp      int64     `json:"exp"`
	Since    time.Time `json:"since"`
	Sequence *uint64   `json:"sequence,omitempty"`
}

// MarshalRevoked renders a held revoked set for a last-known-good entry's
// envelope ("revoked"); nil for none, so the member is left out.
func MarshalRevoked(held []Revoked) (json.RawMessage, error) {
	if len(held) == 0 {
		return nil, nil
	}
	recs := make([]revokedRecord, len(held))
	for i, h := range held {
		if err := h.Validate(); err != nil {
			return nil, fmt.Errorf("revoked[%d]: %w", i, err)
		}
		recs[i] = revokedRecord{Use: h.Use, X5TS256: h.X5TS256, KID: h.KID, Exp: h.NotAfter.Unix(), Since: h.Since.UTC(), Sequence: h.Sequence}
	}
	return json.Marshal(recs)
}

// ParseStoredRevoked reads the "revoked" member of a last-known-good
// entry's envelope; absent (an entry written before issue 38) is none.
// Each entry is checked as a fetched one is. Errors start with
// "revoked: ".
func ParseStoredRevoked(raw json.RawMessage) ([]Revoked, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var recs []revokedRecord
	if err := json.Unmarshal(raw, &recs); err != nil {
		return nil, fmt.Errorf("revoked: %w", err)
	}
	if len(recs) > maxHeldRevoked {
		return nil, fmt.Errorf("revoked: %d entries, more than the %d held", len(recs), maxHeldRevoked)
	}
	out := make([]Revoked, len(recs))
	for i, rec := range recs {
		r := bundledoc.Revocation{Use: rec.Use, X5TS256: rec.X5TS256, KID: rec.KID, NotAfter: time.Unix(rec.Exp, 0).UTC()}
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("revoked[%d]: %w", i, err)
		}
		out[i] = Revoked{Revocation: r, Sequence: rec.Sequence, Since: rec.Since}
	}
	out, _ = unionRevoked(nil, out)
	return out, nil
}

// Revoked is the revoked set held for td (see Revoked), pruned at now: the
// relationship's, or for a trust domain not polled here the one its
// last-known-good entry holds (nil when none, or when it cannot be read).
func (p *Poller) Revoked(td spiffeid.TrustDomain) []Revoked {
	p.mu.Lock()
	r, ok := p.rels[td]
	var held []Revoked
	if ok {
		held = pruneRevoked(r.revoked, p.cfg.Now())
	}
	p.mu.Unlock()
	if ok || p.cfg.LKG == nil {
		return held
	}
	// Read without p.mu, as LoadLastKnownGood does.
	e, err := p.cfg.LKG.Load(td)
	if err != nil || e == nil {
		return nil
	}
	return pruneRevoked(e.Revoked, p.cfg.Now())
}
