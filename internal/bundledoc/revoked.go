package bundledoc

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
)

// RevokedMember is the top-level member of a bundle document that lists
// the authorities its publisher revoked. The Trust Domain and Bundle spec
// allows other top-level members and says consumers must not require
// them: go-spiffe and SPIRE ignore it, trustbridge peers refuse a later
// bundle that brings a listed authority back.
const RevokedMember = "trustbridge_revoked"

// MaxRevocations caps the entries of RevokedMember. An entry lives until
// its authority would have expired anyway, so a publisher holds a few at a
// time; thousands are a hostile document, not an incident.
const MaxRevocations = 256

// maxRevocationExp keeps exp a real date (the end of year 9999), so that
// it converts to time.Time and back unchanged.
const maxRevocationExp = 253402300799

// Revocation is one entry of RevokedMember: an authority its publisher
// revoked. Exactly one of X5TS256 (Use UseX509SVID) and KID (UseJWTSVID)
// is set.
type Revocation struct {
	Use string
	// X5TS256 is the base64url (unpadded) SHA-256 of the certificate DER
	// (RFC 7517 §4.9): a root that was in "keys", or an intermediate
	// that never was (upstream mode signs through one).
	X5TS256 string
	// KID is the revoked JWT authority's key ID.
	KID string
	// NotAfter is when the entry may be forgotten: the revoked
	// authority's own expiry, past which nothing it signed is valid.
	NotAfter time.Time
}

// X509Thumbprint is cert's x5t#S256: the base64url (unpadded) SHA-256 of
// its DER.
func X509Thumbprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// RevokeX509 is the revocation of cert, forgettable when it expires.
func RevokeX509(cert *x509.Certificate) Revocation {
	return Revocation{Use: UseX509SVID, X5TS256: X509Thumbprint(cert), NotAfter: cert.NotAfter.Truncate(time.Second)}
}

// ID is what the entry names: "x5t#S256:<thumbprint>" or "kid:<kid>", for
// messages and as a map key (Use is implied).
func (r Revocation) ID() string {
	if r.Use == UseX509SVID {
		return "x5t#S256:" + r.X5TS256
	}
	return "kid:" + strconv.Quote(r.KID)
}

// String names the revoked authority for messages.
func (r Revocation) String() string {
	if r.Use == UseX509SVID {
		return "X.509 authority x5t#S256 " + r.X5TS256
	}
	return "JWT authority kid " + strconv.Quote(r.KID)
}

// Validate says what is wrong with r, if anything, as the parser would.
func (r Revocation) Validate() error {
	switch r.Use {
	case UseX509SVID:
		if r.KID != "" {
			return errors.New("an x509-svid entry names its certificate by x5t#S256 only; kid must not be set")
		}
		if err := checkThumbprint(r.X5TS256); err != nil {
			return err
		}
	case UseJWTSVID:
		if r.X5TS256 != "" {
			return errors.New("a jwt-svid entry names its key by kid only; x5t#S256 must not be set")
		}
		if r.KID == "" {
			return errors.New("jwt-svid entry has no kid")
		}
		if err := checkDecodedString(r.KID); err != nil {
			return fmt.Errorf("kid %w", err)
		}
	default:
		return fmt.Errorf("use %q: want %q or %q", r.Use, UseX509SVID, UseJWTSVID)
	}
	if exp := r.NotAfter.Unix(); r.NotAfter.IsZero() || exp <= 0 || exp > maxRevocationExp {
		return fmt.Errorf("exp %d is not a Unix time between 1970 and 9999", exp)
	}
	return nil
}

// checkThumbprint accepts the canonical base64url (unpadded) form of a
// SHA-256 digest only, so one certificate has one spelling.
func checkThumbprint(s string) error {
	if s == "" {
		return errors.New("x509-svid entry has no x5t#S256")
	}
	if strings.ContainsAny(s, "=\r\n") {
		return fmt.Errorf("x5t#S256 %q is not unpadded base64url", s)
	}
	sum, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return fmt.Errorf("x5t#S256 %q is not base64url: %w", s, err)
	}
	if len(sum) != sha256.Size {
		return fmt.Errorf("x5t#S256 %q holds %d bytes, want a SHA-256 digest of %d", s, len(sum), sha256.Size)
	}
	return nil
}

// Revocations sorts revs (by use, then what they name) and merges the
// entries naming one authority, keeping the latest NotAfter: the order
// of a document's entries means nothing, and remembering longer is the
// safe side. It refuses an invalid entry and more than MaxRevocations.
func Revocations(revs []Revocation) ([]Revocation, error) {
	out := slices.Clone(revs)
	for i, r := range out {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", RevokedMember, i, err)
		}
		out[i].NotAfter = r.NotAfter.Truncate(time.Second).UTC()
	}
	slices.SortFunc(out, func(a, b Revocation) int {
		return cmp.Or(cmp.Compare(a.Use, b.Use), cmp.Compare(a.ID(), b.ID()), b.NotAfter.Compare(a.NotAfter))
	})
	out = slices.CompactFunc(out, func(a, b Revocation) bool { return a.Use == b.Use && a.ID() == b.ID() })
	if len(out) > MaxRevocations {
		return nil, fmt.Errorf("%s lists %d authorities, more than the %d a peer reads; drop the entries past their exp", RevokedMember, len(out), MaxRevocations)
	}
	return out, nil
}

// RevokedAuthority returns the first entry of revs naming an authority b
// carries in "keys" (X.509 authorities by thumbprint, JWT authorities by
// kid).
func RevokedAuthority(b *spiffebundle.Bundle, revs []Revocation) (Revocation, bool) {
	if b == nil || len(revs) == 0 {
		return Revocation{}, false
	}
	byID := make(map[string]Revocation, len(revs))
	for _, r := range revs {
		byID[r.ID()] = r
	}
	for _, cert := range b.X509Authorities() {
		if r, ok := byID[Revocation{Use: UseX509SVID, X5TS256: X509Thumbprint(cert)}.ID()]; ok {
			return r, true
		}
	}
	for _, kid := range slices.Sorted(maps.Keys(b.JWTAuthorities())) {
		if r, ok := byID[Revocation{Use: UseJWTSVID, KID: kid}.ID()]; ok {
			return r, true
		}
	}
	return Revocation{}, false
}

// MarshalWithRevocations renders b as Marshal does, with revs (when there
// are any) in RevokedMember, sorted and merged as Revocations does, so the
// same bundle and entries always yield the same bytes. Without entries it
// is Marshal. It refuses entries naming an authority b carries: peers
// would refuse the document.
func MarshalWithRevocations(b *spiffebundle.Bundle, revs []Revocation) ([]byte, error) {
	doc, err := Marshal(b)
	if err != nil || len(revs) == 0 {
		return doc, err
	}
	canon, err := Revocations(revs)
	if err != nil {
		return nil, wrap(err)
	}
	if r, ok := RevokedAuthority(b, canon); ok {
		return nil, wrap(fmt.Errorf("%s lists %s, which the bundle still carries; remove it from the bundle first", RevokedMember, r))
	}
	var buf bytes.Buffer
	buf.Write(doc[:len(doc)-1]) // Marshal ends with the closing brace
	buf.WriteString(`,"` + RevokedMember + `":[`)
	for i, r := range canon {
		if i > 0 {
			buf.WriteByte(',')
		}
		writeRevocation(&buf, r)
	}
	buf.WriteString("]}")
	return buf.Bytes(), nil
}

func writeRevocation(buf *bytes.Buffer, r Revocation) {
	buf.WriteString(`{"use":`)
	buf.WriteString(strconv.Quote(r.Use))
	if r.Use == UseX509SVID {
		buf.WriteString(`,"x5t#S256":"` + r.X5TS256 + `"`)
	} else {
		kid, _ := json.Marshal(r.KID) // a string always marshals
		buf.WriteString(`,"kid":`)
		buf.Write(kid)
	}
	buf.WriteString(`,"exp":`)
	buf.WriteString(strconv.FormatInt(r.NotAfter.Unix(), 10))
	buf.WriteByte('}')
}

// ParseRevocations reads RevokedMember from a bundle document: no member
// is no revocations. It is tolerant as the spec is for "keys": an entry
// whose use is missing or unknown is skipped, and so are members of an
// entry it does not know. It is strict about what it reads: a malformed
// entry of a known use (bad or missing x5t#S256, empty kid, missing exp)
// fails the whole member, since skipping it would forget a revocation.
// The result is sorted and merged as Revocations does.
func ParseRevocations(doc []byte) ([]Revocation, error) {
	if err := checkStrict(doc); err != nil {
		return nil, wrap(err)
	}
	members, err := decodeObject(doc, "bundle document")
	if err != nil {
		return nil, wrap(err)
	}
	if err := checkMemberNames(members, RevokedMember); err != nil {
		return nil, wrap(err)
	}
	raw, ok := members[RevokedMember]
	if !ok {
		return nil, nil
	}
	revs, err := parseRevocationList(raw)
	if err != nil {
		return nil, wrap(err)
	}
	return revs, nil
}

func parseRevocationList(raw json.RawMessage) ([]Revocation, error) {
	if kind := jsonKind(raw); kind != "an array" {
		return nil, fmt.Errorf("%s must be an array, got %s", RevokedMember, kind)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("%s: %w", RevokedMember, err)
	}
	if len(entries) > MaxRevocations {
		return nil, fmt.Errorf("%s has %d entries, more than the %d trustbridge reads; the publisher should drop the entries past their exp", RevokedMember, len(entries), MaxRevocations)
	}
	var out []Revocation
	for i, e := range entries {
		r, known, err := parseRevocation(e)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", RevokedMember, i, err)
		}
		if known {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return Revocations(out)
}

// parseRevocation reads one entry; known is false for an entry to skip.
func parseRevocation(raw json.RawMessage) (r Revocation, known bool, err error) {
	m, err := decodeObject(raw, "entry")
	if err != nil {
		return r, false, err
	}
	if err := checkMemberNames(m, "use", "x5t#S256", "kid", "exp"); err != nil {
		return r, false, err
	}
	use, _, err := stringMember(m, "use")
	if err != nil || (use != UseX509SVID && use != UseJWTSVID) {
		return r, false, err
	}
	r.Use = use
	if r.X5TS256, _, err = stringMember(m, "x5t#S256"); err != nil {
		return r, false, err
	}
	if r.KID, _, err = stringMember(m, "kid"); err != nil {
		return r, false, err
	}
	rawExp, ok := m["exp"]
	if !ok {
		return r, false, fmt.Errorf("%s entry has no exp", use)
	}
	exp, err := parseUint(rawExp, "exp", "a Unix time in seconds")
	if err != nil {
		return r, false, err
	}
	if exp == 0 || exp > maxRevocationExp {
		return r, false, fmt.Errorf("exp %d is not a Unix time between 1970 and 9999", exp)
	}
	r.NotAfter = time.Unix(int64(exp), 0).UTC()
	return r, true, r.Validate()
}
