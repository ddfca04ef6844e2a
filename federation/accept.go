package federation

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
)

// Reasons Accept rejects a fetched bundle. Every rejection keeps the last
// good bundle.
var (
	// ErrTrustDomainMismatch: the fetched bundle is for another trust
	// domain than the held one (§4.2, §7.3: never mix trust domains).
	ErrTrustDomainMismatch = errors.New("bundle is for another trust domain")
	// ErrSequenceRegression: spiffe_sequence went down.
	ErrSequenceRegression = errors.New("spiffe_sequence regressed")
	// ErrSequenceConflict: same spiffe_sequence, different authorities.
	ErrSequenceConflict = errors.New("same spiffe_sequence with different authorities")
	// ErrEmptyBundle: "keys": [] (revoke everything) without allowEmpty.
	ErrEmptyBundle = errors.New("bundle has no X.509 or JWT authorities")
)

// Decision is what to do with a fetched bundle Accept did not reject.
type Decision int

const (
	// DecisionAccept: store the fetched bundle. Its authorities, sequence
	// or refresh hint differ from the held one (or nothing is held).
	DecisionAccept Decision = iota + 1
	// DecisionUnchanged: the fetched bundle equals the held one; keep it.
	DecisionUnchanged
)

func (d Decision) String() string {
	switch d {
	case DecisionAccept:
		return "accept"
	case DecisionUnchanged:
		return "unchanged"
	default:
		return fmt.Sprintf("Decision(%d)", int(d))
	}
}

// Accept decides whether fetched may replace held, the bundle currently
// trusted for the same trust domain (nil before the first success).
//
// With both sequences present (Trust Domain and Bundle §4.1.1): a lower
// fetched sequence is rejected; an equal one is Unchanged when the
// authorities are the same (a refresh-hint-only change is accepted, since it
// widens no trust) and rejected when they differ, because two documents
// claiming one version is either a publisher bug or a replay. When either
// side has no sequence, the spec's freshness signal is absent and content
// decides: same authorities and hint is Unchanged, anything else is
// accepted. That includes a publisher dropping spiffe_sequence, which a
// change of implementation can do; a replay needs the endpoint's TLS
// identity anyway.
//
// A bundle without X.509 and JWT authorities (WIT keys alone authenticate
// nothing trustbridge verifies) revokes all trust; it is applied only when
// allowEmpty is set (--federation-allow-empty).
func Accept(held, fetched *spiffebundle.Bundle, allowEmpty bool) (Decision, error) {
	if fetched == nil {
		return 0, errors.New("federation: accept: no fetched bundle")
	}
	if held != nil {
		unchanged, err := againstHeld(held, fetched)
		if err != nil {
			return 0, err
		}
		if unchanged {
			return DecisionUnchanged, nil
		}
	}
	if !allowEmpty && len(fetched.X509Authorities()) == 0 && len(fetched.JWTAuthorities()) == 0 {
		return 0, fmt.Errorf("federation: accept: %w (revocation of every key is applied only when empty bundles are allowed)", ErrEmptyBundle)
	}
	return DecisionAccept, nil
}

// againstHeld is Accept's verdict on fetched against held, its trust
// domain's bundle: an error refuses fetched, and unchanged says it is held
// again.
func againstHeld(held, fetched *spiffebundle.Bundle) (unchanged bool, err error) {
	if held.TrustDomain() != fetched.TrustDomain() {
		return false, fmt.Errorf("federation: accept: %w: fetched %q, held %q", ErrTrustDomainMismatch, fetched.TrustDomain().Name(), held.TrustDomain().Name())
	}
	sameKeys := sameAuthorities(held, fetched)
	hs, hok := held.SequenceNumber()
	fs, fok := fetched.SequenceNumber()
	if hok && fok {
		switch {
		case fs < hs:
			return false, fmt.Errorf("federation: accept: %w: fetched %d, held %d", ErrSequenceRegression, fs, hs)
		case fs == hs && !sameKeys:
			d := Diff(held, fetched)
			return false, fmt.Errorf("federation: accept: %w: sequence %d, %d authorities added, %d removed", ErrSequenceConflict, fs, len(d.Added), len(d.Removed))
		}
	}
	return sameKeys && hok == fok && hs == fs && sameRefreshHint(held, fetched), nil
}

func sameRefreshHint(a, b *spiffebundle.Bundle) bool {
	ah, aok := a.RefreshHint()
	bh, bok := b.RefreshHint()
	return aok == bok && ah == bh
}

// sameAuthorities compares the authority sets, ignoring order.
func sameAuthorities(a, b *spiffebundle.Bundle) bool {
	d := Diff(a, b)
	return len(d.Added) == 0 && len(d.Removed) == 0
}

// AuthorityKind names the kind of a bundle authority.
type AuthorityKind string

// Authority kinds, as go-spiffe's bundle model holds them.
const (
	AuthorityX509 AuthorityKind = "x509"
	AuthorityJWT  AuthorityKind = "jwt"
	AuthorityWIT  AuthorityKind = "wit"
)

// Fingerprint identifies one authority for logs and status: SHA-256 hex of
// the certificate DER for X.509 authorities, of the SubjectPublicKeyInfo for
// JWT and WIT keys (with their key ID).
type Fingerprint struct {
	Kind   AuthorityKind
	KeyID  string // JWT and WIT only
	SHA256 string
}

func (f Fingerprint) String() string {
	if f.KeyID != "" {
		return string(f.Kind) + ":" + f.KeyID + ":" + f.SHA256
	}
	return string(f.Kind) + ":" + f.SHA256
}

// BundleDiff lists the authorities added and removed between two bundles,
// each sorted by kind, key ID and fingerprint.
type BundleDiff struct {
	Added, Removed []Fingerprint
}

// Empty reports whether nothing was added or removed.
func (d BundleDiff) Empty() bool { return len(d.Added) == 0 && len(d.Removed) == 0 }

// Diff compares the authorities of old and new (either may be nil). A JWT
// key whose kid stays but whose key changes shows as removed and added.
func Diff(old, new *spiffebundle.Bundle) BundleDiff {
	o, n := Fingerprints(old), Fingerprints(new)
	inOld := make(map[Fingerprint]bool, len(o))
	for _, f := range o {
		inOld[f] = true
	}
	inNew := make(map[Fingerprint]bool, len(n))
	for _, f := range n {
		inNew[f] = true
	}
	var d BundleDiff
	for _, f := range n {
		if !inOld[f] {
			d.Added = append(d.Added, f)
		}
	}
	for _, f := range o {
		if !inNew[f] {
			d.Removed = append(d.Removed, f)
		}
	}
	return d
}

// Fingerprints returns the fingerprints of every authority in b (none for
// nil), sorted and without duplicates.
func Fingerprints(b *spiffebundle.Bundle) []Fingerprint {
	if b == nil {
		return nil
	}
	var out []Fingerprint
	seen := make(map[Fingerprint]bool)
	add := func(f Fingerprint) {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	for _, c := range b.X509Authorities() {
		add(Fingerprint{Kind: AuthorityX509, SHA256: sha256Hex(c.Raw)})
	}
	for kid, k := range b.JWTAuthorities() {
		add(Fingerprint{Kind: AuthorityJWT, KeyID: kid, SHA256: spkiSHA256(k)})
	}
	for kid, k := range b.WITAuthorities() {
		add(Fingerprint{Kind: AuthorityWIT, KeyID: kid, SHA256: spkiSHA256(k)})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.KeyID != b.KeyID {
			return a.KeyID < b.KeyID
		}
		return a.SHA256 < b.SHA256
	})
	return out
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// spkiSHA256 fingerprints a public key by its DER SubjectPublicKeyInfo. A
// key Go cannot marshal (none that bundledoc accepts) gets a marker that
// still compares equal to itself only by type.
func spkiSHA256(k crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return fmt.Sprintf("unmarshalable-%T", k)
	}
	return sha256Hex(der)
}
