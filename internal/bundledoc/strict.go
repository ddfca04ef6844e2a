package bundledoc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
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
		seen      map[string]struct{}
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
				if _, dup := top.seen[t]; dup {
					return fmt.Errorf("duplicate member %q in %s", t, top.path)
				}
				top.seen[t] = struct{}{}
				top.member = t
				top.expectKey = false
				continue
			case json.Delim: // '}' closes the object below
			default:
				return fmt.Errorf("invalid JSON at offset %d: member name expected", dec.InputOffset())
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
					seen:      map[string]struct{}{},
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
