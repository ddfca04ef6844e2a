package trustpolicy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Pattern matches SPIFFE IDs: one ID exactly ("spiffe://td/ns/a/sa/b"), or
// every ID below a path ("spiffe://td/ns/a/*": /ns/a/sa/b and /ns/a/x/y, not
// /ns/a itself nor /ns/ab). "spiffe://td/*" is every workload of td. There
// are no other wildcards and no regular expressions: a pattern means what
// it says to someone reading it, and Envoy's URI SAN matchers express it
// exactly (Istio CVE-2026-39350 came from regular expressions built from
// such patterns).
type Pattern struct {
	td     spiffeid.TrustDomain
	exact  spiffeid.ID // zero for a prefix
	prefix string      // the path prefix without the final "/"; "" with td is every member
	text   string
}

// ParsePattern parses a pattern. Only the canonical spelling is accepted
// (lower-case trust domain, no percent-encoding, no trailing slash, no
// empty, "." or ".." segments), since a peer's certificate is compared
// byte for byte with it.
func ParsePattern(s string) (Pattern, error) {
	if s == "" {
		return Pattern{}, errors.New("empty SPIFFE ID pattern")
	}
	base, wild := strings.CutSuffix(s, "/*")
	if strings.Contains(base, "*") {
		return Pattern{}, fmt.Errorf("pattern %q: '*' is allowed only as a final \"/*\" segment (exact IDs and path prefixes only, no regular expressions)", s)
	}
	if strings.HasSuffix(base, "/") {
		return Pattern{}, fmt.Errorf("pattern %q: trailing '/'; write %q for everything below that path", s, strings.TrimSuffix(base, "/")+"/*")
	}
	var td spiffeid.TrustDomain
	var id spiffeid.ID
	var err error
	if wild && !strings.Contains(strings.TrimPrefix(base, "spiffe://"), "/") {
		td, err = spiffeid.TrustDomainFromString(base)
		if err == nil && td.IDString() != base {
			err = errors.New("not canonical")
		}
	} else {
		id, err = spiffeid.FromString(base)
		if err == nil && id.String() != base {
			err = errors.New("not canonical")
		}
		td = id.TrustDomain()
	}
	if err != nil {
		return Pattern{}, fmt.Errorf("pattern %q: %w (want spiffe://<trust-domain>/<path> or spiffe://<trust-domain>/<path>/*)", s, err)
	}
	if !wild && id.Path() == "" {
		return Pattern{}, fmt.Errorf("pattern %q names a trust domain, not a workload; write %q for every workload in it", s, s+"/*")
	}
	p := Pattern{td: td, text: s}
	if wild {
		p.prefix = id.Path()
	} else {
		p.exact = id
	}
	return p, nil
}

// MustParsePattern is ParsePattern for tests and constants; it panics on error.
func MustParsePattern(s string) Pattern {
	p, err := ParsePattern(s)
	if err != nil {
		panic(err)
	}
	return p
}

// TrustDomain is the trust domain every matched ID belongs to.
func (p Pattern) TrustDomain() spiffeid.TrustDomain { return p.td }

// IsPrefix reports whether p matches everything below a path.
func (p Pattern) IsPrefix() bool { return p.exact.IsZero() }

// String is the pattern as written.
func (p Pattern) String() string { return p.text }

// Matches reports whether id matches p.
func (p Pattern) Matches(id spiffeid.ID) bool {
	if !p.exact.IsZero() {
		return id == p.exact
	}
	if !id.MemberOf(p.td) {
		return false
	}
	path := id.Path()
	return len(path) > len(p.prefix) && strings.HasPrefix(path, p.prefix) && path[len(p.prefix)] == '/'
}

// SAN is the URI SAN string an Envoy StringMatcher compares: the exact ID,
// or for a prefix pattern the prefix with its final "/", so that
// spiffe://td/ns/pay/* never matches spiffe://td/ns/payments/x.
func (p Pattern) SAN() (value string, prefix bool) {
	if !p.exact.IsZero() {
		return p.exact.String(), false
	}
	return p.td.IDString() + p.prefix + "/", true
}
