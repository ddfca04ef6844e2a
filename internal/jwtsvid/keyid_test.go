package jwtsvid

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func header(h string) string { return base64.RawURLEncoding.EncodeToString([]byte(h)) }

func TestKeyID(t *testing.T) {
	assert.Equal(t, "k1", KeyID(header(`{"alg":"ES256","kid":"k1"}`)+".e30.c2ln"))
	for _, bad := range []string{"", "nodot", "!!!.e30.x", header(`{"kid":1}`) + ".e30.x", header(`{}`) + ".e30.x",
		strings.Repeat("a", maxHeader+1) + ".e30.x"} {
		assert.Empty(t, KeyID(bad), bad)
	}
}

func FuzzKeyID(f *testing.F) {
	f.Add(header(`{"alg":"ES256","kid":"k1"}`) + ".e30.c2ln")
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		if kid := KeyID(token); kid != "" && !strings.Contains(token, ".") {
			t.Fatalf("a kid from a token without a header: %q", kid)
		}
	})
}
