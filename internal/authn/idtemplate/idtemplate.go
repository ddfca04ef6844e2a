package idtemplate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// MaxTemplateLen and MaxIDLen follow the SPIFFE ID spec's 2048-byte URI
// bound; MaxSegmentLen is one value's share of it.
const (
	MaxTemplateLen = 2048
	MaxIDLen       = 2048
	MaxSegmentLen  = 255
)

// Lex splits s into literal text and placeholders, in order: literal
// makes the part of a run of literal text, placeholder the part of what
// stands between {{ and }} (untrimmed), found at 1-based byte column col.
// A { or } outside a placeholder and an unclosed {{ are refused, naming
// the column; Lex stops at the first error, placeholder's included.
func Lex[P any](s string, literal func(string) P, placeholder func(inner string, col int) (P, error)) ([]P, error) {
	var parts []P
	for i := 0; i < len(s); {
		open := strings.Index(s[i:], "{{")
		if open < 0 {
			open = len(s) - i
		}
		if lit := s[i : i+open]; lit != "" {
			if j := strings.IndexAny(lit, "{}"); j >= 0 {
				return nil, fmt.Errorf("column %d: stray %q outside a {{...}} placeholder", i+j+1, lit[j])
			}
			parts = append(parts, literal(lit))
		}
		if i += open; i >= len(s) {
			break
		}
		end := strings.Index(s[i+2:], "}}")
		if end < 0 {
			return nil, fmt.Errorf("column %d: {{ is not closed by }}", i+1)
		}
		p, err := placeholder(s[i+2:i+2+end], i+1)
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
		i += 2 + end + 2
	}
	return parts, nil
}

// CheckSegment accepts exactly one SPIFFE ID path segment (SPIFFE ID
// §2.2): 1 to MaxSegmentLen of A-Z a-z 0-9 . - _, not "." or "..". So no
// "/", no percent-encoding, no whitespace, no look-alike unicode.
func CheckSegment(s string) error {
	switch {
	case s == "":
		return errors.New("value is empty")
	case len(s) > MaxSegmentLen:
		return fmt.Errorf("value is %d bytes, more than %d", len(s), MaxSegmentLen)
	case s == "." || s == "..":
		return fmt.Errorf("value %q is a relative path segment", s)
	}
	for i := 0; i < len(s); i++ {
		if !segmentByte(s[i]) {
			return fmt.Errorf("value %q: byte %d is not one of A-Z a-z 0-9 . - _", truncate(s, 64), i+1)
		}
	}
	return nil
}

func segmentByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_'
}

// ID parses s, a template filled in with values each checked by
// CheckSegment, as a SPIFFE ID, and checks it all the same: at most
// MaxIDLen bytes, in trust domain td, with the template's number of path
// segments. from names the values in an error ("claims", "facts").
func ID(s string, td spiffeid.TrustDomain, segments int, from string) (spiffeid.ID, error) {
	if len(s) > MaxIDLen {
		return spiffeid.ID{}, fmt.Errorf("the SPIFFE ID would be %d bytes, more than %d", len(s), MaxIDLen)
	}
	id, err := spiffeid.FromString(s)
	switch {
	case err != nil:
		return spiffeid.ID{}, fmt.Errorf("the %s do not form a SPIFFE ID: %w", from, err)
	case id.TrustDomain() != td:
		return spiffeid.ID{}, fmt.Errorf("the SPIFFE ID is not in trust domain %q", td.Name())
	case strings.Count(id.Path(), "/") != segments:
		return spiffeid.ID{}, fmt.Errorf("the SPIFFE ID has %d path segments, not the template's %d", strings.Count(id.Path(), "/"), segments)
	}
	return id, nil
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
