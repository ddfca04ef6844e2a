package bundleserver

import (
	"strings"
	"testing"
)

// FuzzIfNoneMatch: the If-None-Match parser never panics, and it matches
// only when the header holds "*" or the exact opaque tag: a false match
// would answer 304 and leave a peer on a stale bundle.
func FuzzIfNoneMatch(f *testing.F) {
	const etag = `"0123456789abcdef"`
	for _, s := range []string{`*`, etag, `W/` + etag, `"x", ` + etag, `"x"`, `W/"x"`, `"unterminated`, `,,,`, ``, `"0123456789abcdef`, `x"0123456789abcdef"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		got := noneMatch([]string{header}, etag)
		if got && !strings.Contains(header, "*") && !strings.Contains(header, etag) {
			t.Fatalf("matched %q without * or the tag", header)
		}
		if !got && (strings.TrimSpace(header) == etag || strings.TrimSpace(header) == "W/"+etag) {
			t.Fatalf("did not match the tag itself: %q", header)
		}
	})
}
