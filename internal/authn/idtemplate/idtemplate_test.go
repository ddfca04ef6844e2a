package idtemplate

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// token is what the tests' placeholder function makes: a literal, or a
// placeholder's trimmed text and column.
type token struct {
	lit, ph string
	col     int
}

func lexTokens(s string) ([]token, error) {
	return Lex(s, func(lit string) token { return token{lit: lit} }, func(inner string, col int) (token, error) {
		if strings.Trim(inner, " ") == ".Bad" {
			return token{}, fmt.Errorf("column %d: bad", col)
		}
		return token{ph: strings.Trim(inner, " "), col: col}, nil
	})
}

func TestLex(t *testing.T) {
	tests := []struct {
		s      string
		want   []token
		errHas string
	}{
		{s: "", want: nil},
		{s: "spiffe://x.test/a", want: []token{{lit: "spiffe://x.test/a"}}},
		{s: "spiffe://{{.TrustDomain}}/ns/{{ .A }}", want: []token{{lit: "spiffe://"}, {ph: ".TrustDomain", col: 10}, {lit: "/ns/"}, {ph: ".A", col: 30}}},
		{s: "{{.A}}{{.B}}", want: []token{{ph: ".A", col: 1}, {ph: ".B", col: 7}}},
		{s: "a/}b", errHas: "column 3: stray '}' outside a {{...}} placeholder"},
		{s: "a{b", errHas: "column 2: stray '{'"},
		{s: "ab/{{.A", errHas: "column 4: {{ is not closed by }}"},
		{s: "x/{{.Bad}}/}", errHas: "column 3: bad"}, // the first error, in order
	}
	for _, tt := range tests {
		t.Run(tt.s, func(t *testing.T) {
			got, err := lexTokens(tt.s)
			if tt.errHas != "" {
				assert.ErrorContains(t, err, tt.errHas)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestCheckSegment(t *testing.T) {
	for _, tt := range []struct{ s, errHas string }{
		{"payments-api_v1.2", ""},
		{strings.Repeat("a", MaxSegmentLen), ""},
		{"", "value is empty"},
		{strings.Repeat("a", MaxSegmentLen+1), "more than 255"},
		{".", "relative path segment"},
		{"..", "relative path segment"},
		{"a/b", `value "a/b": byte 2 is not one of A-Z a-z 0-9 . - _`},
		{"a%2Fb", "byte 2"},
		{"a b", "byte 2"},
		{"aв", "byte 2"}, // a look-alike: Cyrillic ve
		{strings.Repeat("a", 70) + "/", `value "` + strings.Repeat("a", 64) + `…": byte 71`},
	} {
		t.Run(truncate(tt.s, 16), func(t *testing.T) {
			err := CheckSegment(tt.s)
			if tt.errHas == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.errHas)
		})
	}
}

func TestID(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	id, err := ID("spiffe://example.org/ns/a", td, 2, "claims")
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/a", id.String())

	for _, tt := range []struct{ s, errHas string }{
		{"spiffe://example.org/" + strings.Repeat("a", MaxIDLen), "the SPIFFE ID would be 2069 bytes, more than 2048"},
		{"spiffe://example.org/a//b", "the claims do not form a SPIFFE ID: "},
		{"spiffe://other.org/ns/a", `the SPIFFE ID is not in trust domain "example.org"`},
		{"spiffe://example.org/ns/a/b", "the SPIFFE ID has 3 path segments, not the template's 2"},
	} {
		t.Run(tt.errHas, func(t *testing.T) {
			_, err := ID(tt.s, td, 2, "claims")
			assert.ErrorContains(t, err, tt.errHas)
		})
	}
}

// FuzzLex checks that Lex never panics and that what it accepts it
// splits without loss: the parts, placeholders rewritten as written,
// make the template again.
func FuzzLex(f *testing.F) {
	for _, s := range []string{"", "spiffe://{{.TrustDomain}}/ns/{{ .A }}", "{{", "}}", "{{}}", "a{{.A}}b{{.B}}", "{{{{.A}}}}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b strings.Builder
		_, err := Lex(s, func(lit string) string { b.WriteString(lit); return lit }, func(inner string, col int) (string, error) {
			if s[col-1:col+1] != "{{" {
				return "", errors.New("col does not point at {{")
			}
			b.WriteString("{{" + inner + "}}")
			return inner, nil
		})
		if err != nil {
			if strings.Contains(err.Error(), "col does not point") {
				t.Fatal(err)
			}
			return
		}
		if b.String() != s {
			t.Fatalf("parts make %q, not %q", b.String(), s)
		}
	})
}
