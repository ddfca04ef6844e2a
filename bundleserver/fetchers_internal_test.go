package bundleserver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestUserAgent(t *testing.T) {
	long := strings.Repeat("a", maxUserAgent)
	for _, tc := range []struct {
		name string
		in   []string
		want string
	}{
		{"absent", nil, ""},
		{"empty", []string{""}, ""},
		{"go-spiffe", []string{"Go-http-client/1.1"}, "Go-http-client/1.1"},
		{"first line only", []string{"spire-server/1.11", "other"}, "spire-server/1.11"},
		{"at the limit", []string{long}, long},
		{"truncated", []string{long + "bcd"}, long},
		{"control characters dropped", []string{"a\tb\x00c\x1bd\x7fe"}, "abcde"},
		{"dropped before counting", []string{"\x00\x01" + long + "z"}, long},
		{"non-ASCII shown as ?", []string{"café/1 ☃"}, "caf?/1 ?"},
		{"invalid UTF-8 shown as ?", []string{"a\xff\xfeb"}, "a??b"},
		{"a terminal escape cannot survive", []string{"\x1b]0;pwned\x07x"}, "]0;pwnedx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := userAgent(tc.in)
			assert.Equal(t, tc.want, got)
			assert.LessOrEqual(t, len(got), maxUserAgent)
		})
	}
}

func TestRemoteIP(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"192.0.2.1:443", "192.0.2.1", true},
		{"[::1]:50000", "::1", true},
		{"[2001:DB8:0:0::1]:1", "2001:db8::1", true},
		{"[::ffff:192.0.2.7]:1", "192.0.2.7", true},
		{"[fe80::1%eth0]:1", "fe80::1", true},
		{"192.0.2.1", "", false}, // no port: not what net/http sets
		{"@", "", false},         // a Unix socket behind Handler
		{"", "", false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := remoteIP(tc.in)
			assert.Equal(t, tc.ok, ok)
			if ok {
				assert.Equal(t, tc.want, got.String())
			}
		})
	}
}
