package workload

import (
	"bytes"
	"cmp"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/internal/svidcheck"
)

// SVID is the X509-SVID the Workload API serves: its SPIFFE ID, its
// chain (leaf first, no root) and its private key, which must be
// exportable as PKCS#8: the Workload API hands it to the workload.
type SVID struct {
	ID    spiffeid.ID
	Chain []*x509.Certificate
	Key   crypto.Signer
}

// State is what the server serves at one moment. A State is immutable
// once published: build a new one for every change.
type State struct {
	// SVID is the workload's identity; nil until one is issued (every
	// call is then refused with PermissionDenied).
	SVID *SVID
	// Bundles are the trust domains the workload may trust, each at most
	// once: the SVID's own first, then the federated ones.
	Bundles []*spiffebundle.Bundle
	// Stale is non-nil while the upstream the State comes from is
	// unreachable: the State is the last good one and is still served.
	Stale error

	// enc holds the State's encoding once a stream asked for it; Cell.Set
	// gives each published State its own, so every stream on a State,
	// current or already replaced, shares one encoding.
	enc *encSlot
}

// encSlot is where a published State's encoding is kept. owner guards
// against a copy of a published State (which copies the pointer) being
// served by another Source: the slot is used only for its own State.
// cell is the Cell that published it, whose reference encoding its
// frames are shared with.
type encSlot struct {
	owner *State
	cell  *Cell
	once  sync.Once
	e     *encoded
}

// encRef is the last encoding of one Source's State that was current when
// it was encoded: the reference the next State's frames are shared with,
// so that a stream sees by pointer that a response did not change, and
// the cache of a current State that no Cell published. Encodings against
// one reference are serialised by mu.
type encRef struct {
	mu   sync.Mutex
	last atomic.Pointer[encoded]
}

// slot is st's encoding slot, nil when st was not published by a Cell.
func (st *State) slot() *encSlot {
	if st.enc == nil || st.enc.owner != st {
		return nil
	}
	return st.enc
}

// Source gives the current State and a channel closed when a newer one
// replaces it.
type Source interface {
	State() (*State, <-chan struct{})
}

// JWTMinter mints JWT-SVIDs for the identity of the current State.
type JWTMinter interface {
	MintJWTSVID(ctx context.Context, audience []string) (token string, err error)
}

// Cell is a Source whose State is replaced with Set. Each State it
// publishes keeps its own encoding, shared by every stream and every
// Server that serves it.
type Cell struct {
	mu      sync.Mutex
	cur     *State
	changed chan struct{}
	ref     encRef
}

// NewCell returns a Cell holding an empty State (no identity).
func NewCell() *Cell {
	return &Cell{cur: &State{}, changed: make(chan struct{})}
}

// State returns the current State and a channel closed by the next Set.
func (c *Cell) State() (*State, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.changed
}

// Set checks st (see Check), publishes a copy with the SVID's trust
// domain first and the others sorted by name, and wakes every watcher.
// On error the previous State stays.
func (c *Cell) Set(st State) error {
	if err := Check(&st); err != nil {
		return err
	}
	st.Bundles = ordered(st.SVID, st.Bundles)
	st.enc = &encSlot{owner: &st, cell: c}
	ch := make(chan struct{})
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.changed
	c.cur, c.changed = &st, ch
	close(prev)
	return nil
}

// Check refuses a State the server could not serve as the Workload API
// requires: an SVID whose leaf is not an X509-SVID for its ID, is a CA,
// does not match its key, or whose key cannot be exported; a nil or
// repeated bundle; no bundle for the SVID's own trust domain; an SVID
// that does not chain to that bundle's X.509 authorities (a workload
// would be handed a certificate its own bundle rejects, as when the
// bundle lags a root rotation).
func Check(st *State) error {
	seen := make(map[spiffeid.TrustDomain]bool, len(st.Bundles))
	for i, b := range st.Bundles {
		if b == nil {
			return fmt.Errorf("workload: bundle %d is nil", i)
		}
		if seen[b.TrustDomain()] {
			return fmt.Errorf("workload: two bundles for trust domain %q", b.TrustDomain().Name())
		}
		seen[b.TrustDomain()] = true
	}
	if st.SVID == nil {
		return nil
	}
	if err := checkSVID(st.SVID); err != nil {
		return fmt.Errorf("workload: SVID for %s: %w", st.SVID.ID, err)
	}
	own := st.SVID.ID.TrustDomain()
	if !seen[own] {
		return fmt.Errorf("workload: no bundle for the SVID's trust domain %q", own.Name())
	}
	i := slices.IndexFunc(st.Bundles, func(b *spiffebundle.Bundle) bool { return b.TrustDomain() == own })
	if err := verifyChain(st.SVID.Chain, st.Bundles[i]); err != nil {
		return fmt.Errorf("workload: SVID for %s: %w; check that the bundle of %q carries the root that issued it", st.SVID.ID, err, own.Name())
	}
	return nil
}

// verifyChain checks that chain verifies against own's X.509 authorities
// at some moment: Check has no clock, and an SVID served past its expiry
// during an outage is the last good one, not a wrong one. crypto/x509
// checks the root's validity too, and a CA backdates leaves even before
// its own NotBefore, so the moments tried are the starts of the windows
// in which the chain and one of own's roots that could have issued it
// are all valid.
func verifyChain(chain []*x509.Certificate, own *spiffebundle.Bundle) error {
	var first error
	for _, at := range verifyInstants(chain, own.X509Authorities()) {
		_, _, err := svidcheck.Verify(chain, own, x509.ExtKeyUsageAny, x509svid.WithTime(at))
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// verifyInstants is the start of chain's validity window (the latest
// NotBefore, whose error is returned when nothing verifies), then the
// start of its intersection with each root that names the issuer of a
// certificate in chain, where that is not empty; no instant twice.
func verifyInstants(chain, roots []*x509.Certificate) []time.Time {
	lo, hi := chain[0].NotBefore, chain[0].NotAfter
	for _, c := range chain[1:] {
		lo, hi = later(lo, c.NotBefore), earlier(hi, c.NotAfter)
	}
	out := []time.Time{lo}
	for _, r := range roots {
		issues := slices.ContainsFunc(chain, func(c *x509.Certificate) bool { return bytes.Equal(c.RawIssuer, r.RawSubject) })
		at := later(lo, r.NotBefore)
		if issues && !at.After(earlier(hi, r.NotAfter)) && !slices.ContainsFunc(out, at.Equal) {
			out = append(out, at)
		}
	}
	return out
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func checkSVID(s *SVID) error {
	if len(s.Chain) == 0 || slices.Contains(s.Chain, nil) {
		return errors.New("empty certificate chain or a nil certificate in it")
	}
	if s.Key == nil {
		return errors.New("no private key")
	}
	leaf := s.Chain[0]
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return fmt.Errorf("leaf is not an X509-SVID: %w", err)
	}
	if id != s.ID {
		return fmt.Errorf("leaf is for %s", id)
	}
	if leaf.IsCA {
		return errors.New("leaf is a CA certificate")
	}
	pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(s.Key.Public()) {
		return errors.New("private key does not match the leaf")
	}
	if _, err := x509.MarshalPKCS8PrivateKey(s.Key); err != nil {
		return fmt.Errorf("private key cannot be exported as PKCS#8: %w", err)
	}
	return nil
}

// ordered is bundles with svid's trust domain first and the others
// sorted by name.
func ordered(svid *SVID, bundles []*spiffebundle.Bundle) []*spiffebundle.Bundle {
	var own spiffeid.TrustDomain
	if svid != nil {
		own = svid.ID.TrustDomain()
	}
	out := slices.Clone(bundles)
	slices.SortFunc(out, func(a, b *spiffebundle.Bundle) int {
		switch {
		case a.TrustDomain() == own:
			return -1
		case b.TrustDomain() == own:
			return 1
		}
		return cmp.Compare(a.TrustDomain().Name(), b.TrustDomain().Name())
	})
	return out
}
