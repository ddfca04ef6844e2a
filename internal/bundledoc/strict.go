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
	s := newStrictScanner(data)
	for {
		tok, err := s.next()
		if err != nil {
			return err
		}
		done, err := s.accept(tok)
		if err != nil {
			return err
		}
		if done {
			break
		}
	}
	if _, err := s.dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("unexpected data after the JSON document at offset %d", s.dec.InputOffset())
	}
	return nil
}

// strictScanner walks one JSON document token by token for checkStrict,
// keeping the stack of open objects and arrays: the member names seen in
// each object, and the path of each value for error messages.
type strictScanner struct {
	dec   *json.Decoder
	stack []*strictFrame
}

// strictFrame is one open object or array.
type strictFrame struct {
	object    bool
	expectKey bool
	seen      map[string]string // case-folded name → name as written
	path      string
	member    string // member whose value is being read, for paths
	index     int    // next array index, for paths
}

func newStrictScanner(data []byte) *strictScanner {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return &strictScanner{dec: dec}
}

// next reads the next token, naming a document that ends before its first
// value is complete as empty or truncated.
func (s *strictScanner) next() (json.Token, error) {
	tok, err := s.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("document is empty or truncated")
		}
		return nil, fmt.Errorf("invalid JSON at offset %d: %w", s.dec.InputOffset(), err)
	}
	return tok, nil
}

// accept checks one token and updates the stack. done reports that the
// top-level value is complete.
func (s *strictScanner) accept(tok json.Token) (done bool, err error) {
	if top := s.top(); top != nil && top.object && top.expectKey {
		switch t := tok.(type) {
		case string:
			return false, s.memberName(top, t)
		case json.Delim: // '}' closes the object below
		default:
			return false, fmt.Errorf("invalid JSON at offset %d: member name expected", s.dec.InputOffset())
		}
	}
	if str, ok := tok.(string); ok {
		if err := checkDecodedString(str); err != nil {
			return false, fmt.Errorf("string in %s: %w", s.childPath(), err)
		}
	}
	if d, ok := tok.(json.Delim); ok {
		switch d {
		case '{', '[':
			return false, s.open(d)
		case '}', ']':
			s.stack = s.stack[:len(s.stack)-1]
		}
	}
	s.valueDone()
	return len(s.stack) == 0, nil
}

// memberName records the name of the next member of the object top,
// refusing duplicates and names that fold together.
func (s *strictScanner) memberName(top *strictFrame, name string) error {
	// encoding/json (and so go-spiffe) matches member names
	// case-insensitively, with Unicode folding, and the last
	// match wins: "KEYS" after "keys" would give go-spiffe a
	// different bundle than the one we checked. Refuse names
	// that fold together as duplicates.
	folded := foldName(name)
	if prev, dup := top.seen[folded]; dup {
		if prev == name {
			return fmt.Errorf("duplicate member %q in %s", name, top.path)
		}
		return fmt.Errorf("members %q and %q in %s differ only in case; other parsers would read one as the other", prev, name, top.path)
	}
	if err := checkDecodedString(name); err != nil {
		return fmt.Errorf("member name in %s: %w", top.path, err)
	}
	top.seen[folded] = name
	top.member = name
	top.expectKey = false
	return nil
}

// open pushes the object or array that d opens, refusing nesting past
// maxDepth.
func (s *strictScanner) open(d json.Delim) error {
	if len(s.stack) >= maxDepth {
		return fmt.Errorf("document nests deeper than %d levels at %s", maxDepth, s.path())
	}
	s.stack = append(s.stack, &strictFrame{
		object:    d == '{',
		expectKey: d == '{',
		seen:      map[string]string{},
		path:      s.childPath(),
	})
	return nil
}

// top is the innermost open object or array, nil at the top level.
func (s *strictScanner) top() *strictFrame {
	if len(s.stack) == 0 {
		return nil
	}
	return s.stack[len(s.stack)-1]
}

// path is the path of the innermost open object or array.
func (s *strictScanner) path() string {
	if top := s.top(); top != nil {
		return top.path
	}
	return "$"
}

// childPath is the path of the value being read in the innermost open
// object or array.
func (s *strictScanner) childPath() string {
	top := s.top()
	if top == nil {
		return "$"
	}
	if top.object {
		return top.path + "." + strconv.Quote(top.member)
	}
	return top.path + "[" + strconv.Itoa(top.index) + "]"
}

// valueDone records that a complete value was read in the current frame.
func (s *strictScanner) valueDone() {
	top := s.top()
	if top == nil {
		return
	}
	if top.object {
		top.expectKey = true
	} else {
		top.index++
	}
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
