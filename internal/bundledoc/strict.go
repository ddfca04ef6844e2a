package bundledoc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxDepth bounds JSON nesting. A bundle map is five levels deep at most
// (map → trust_domains → bundle → keys → key → x5c); anything far deeper is
// hostile input, not a bundle.
const maxDepth = 32

// checkStrict rejects what encoding/json silently accepts but a trust
// document must not contain: invalid UTF-8 (encoding/json replaces it with
// U+FFFD), duplicate member names at any depth (encoding/json keeps the last
// one, so two parsers could see two different bundles), data after the
// document, and absurd nesting.
func checkStrict(data []byte) error {
	if !utf8.Valid(data) {
		return fmt.Errorf("document is not valid UTF-8 (first bad byte at offset %d)", firstInvalidUTF8(data))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()

	type frame struct {
		object    bool
		expectKey bool
		seen      map[string]string // case-folded name → name as written
		path      string
		member    string // member whose value is being read, for paths
		index     int    // next array index, for paths
	}
	var stack []*frame
	path := func() string {
		if len(stack) == 0 {
			return "$"
		}
		return stack[len(stack)-1].path
	}
	childPath := func() string {
		if len(stack) == 0 {
			return "$"
		}
		top := stack[len(stack)-1]
		if top.object {
			return top.path + "." + strconv.Quote(top.member)
		}
		return top.path + "[" + strconv.Itoa(top.index) + "]"
	}
	// valueDone records that a complete value was read in the current frame.
	valueDone := func() {
		if len(stack) == 0 {
			return
		}
		top := stack[len(stack)-1]
		if top.object {
			top.expectKey = true
		} else {
			top.index++
		}
	}

	for {
		tok, err := dec.Token()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("document is empty or truncated")
			}
			return fmt.Errorf("invalid JSON at offset %d: %w", dec.InputOffset(), err)
		}
		top := (*frame)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.expectKey {
			switch t := tok.(type) {
			case string:
				// encoding/json (and so go-spiffe) matches member names
				// case-insensitively, with Unicode folding, and the last
				// match wins: "KEYS" after "keys" would give go-spiffe a
				// different bundle than the one we checked. Refuse names
				// that fold together as duplicates.
				folded := foldName(t)
				if prev, dup := top.seen[folded]; dup {
					if prev == t {
						return fmt.Errorf("duplicate member %q in %s", t, top.path)
					}
					return fmt.Errorf("members %q and %q in %s differ only in case; other parsers would read one as the other", prev, t, top.path)
				}
				if err := checkDecodedString(t); err != nil {
					return fmt.Errorf("member name in %s: %w", top.path, err)
				}
				top.seen[folded] = t
				top.member = t
				top.expectKey = false
				continue
			case json.Delim: // '}' closes the object below
			default:
				return fmt.Errorf("invalid JSON at offset %d: member name expected", dec.InputOffset())
			}
		}
		if str, ok := tok.(string); ok {
			if err := checkDecodedString(str); err != nil {
				return fmt.Errorf("string in %s: %w", childPath(), err)
			}
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if len(stack) >= maxDepth {
					return fmt.Errorf("document nests deeper than %d levels at %s", maxDepth, path())
				}
				stack = append(stack, &frame{
					object:    t == '{',
					expectKey: t == '{',
					seen:      map[string]string{},
					path:      childPath(),
				})
				continue
			case '}', ']':
				stack = stack[:len(stack)-1]
			}
		}
		valueDone()
		if len(stack) == 0 {
			break
		}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("unexpected data after the JSON document at offset %d", dec.InputOffset())
	}
	return nil
}

// foldName maps a member name to a canonical representative of its
// Unicode simple case-folding orbit, so that names equal under
// strings.EqualFold (including ſ for s and the Kelvin sign for k) collide.
func foldName(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		min := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < min {
				min = f
			}
		}
		b.WriteRune(min)
	}
	return b.String()
}

// checkMemberNames refuses members whose names are case variants of the
// names we read (e.g. "Spiffe_Sequence" without "spiffe_sequence"):
// encoding/json-based parsers such as go-spiffe's would take them for the
// real member, and we would not.
func checkMemberNames(m map[string]json.RawMessage, known ...string) error {
	for name := range m {
		for _, k := range known {
			if name != k && foldName(name) == foldName(k) {
				return fmt.Errorf("member %q is a case variant of %q; other parsers would read it as that", name, k)
			}
		}
	}
	return nil
}

// checkDecodedString refuses U+FFFD in a decoded string. The raw document
// is valid UTF-8, so U+FFFD here comes from an escaped lone surrogate
// ("\ud800"), which encoding/json silently replaces; two distinct kids
// could otherwise decode to the same string.
func checkDecodedString(s string) error {
	if strings.ContainsRune(s, utf8.RuneError) {
		return errors.New("contains an invalid \\u escape (lone surrogate) or U+FFFD")
	}
	return nil
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return -1
}

// isUnsignedInteger reports whether a raw JSON value (already known to be
// syntactically valid) is a plain non-negative integer: no sign, fraction or
// exponent.
func isUnsignedInteger(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// jsonKind names the JSON type of a raw value for error messages.
func jsonKind(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if s == "" {
		return "nothing"
	}
	switch s[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}
