package statusui

import (
	"bytes"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// FuzzRender puts arbitrary text in every free-text field of a snapshot
// and checks that the page still parses to the same inert structure: no
// value ever becomes markup.
func FuzzRender(f *testing.F) {
	for _, seed := range []string{
		"", "a", hostile, "</title><script>alert(1)</script>", "</style><script>x</script>", "<!--", "]]>",
		"<svg><foreignObject><iframe srcdoc=x>", "javascript:alert(1)", "\x00\xff\xfe", "CN=a\\,b,O=c", "&amp;&#60;",
		"\u202e\u2066rtl", `" onmouseover="x`, "' onload='x", "url(#x)", "{{.}}",
	} {
		f.Add(seed, seed)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		s, fs := realisticSnapshot()
		s.TrustDomain, s.Actor = a, b
		s.TrustDomains[0].Name = a
		s.TrustDomains[0].Authorities[0].Subject = "CN=" + a + "," + b
		s.TrustDomains[0].Authorities[3].KeyID = b
		fed := s.TrustDomains[1].Federation
		fed.LastError, fed.EndpointURL, fed.Profile, fed.State, fed.Origin = a, b, a, b, "crd:"+a
		fed.Refusals = map[string]uint64{a: 1, b: 2}
		s.TrustDomains[2].Sources = []string{"file:" + b}
		fs[0].Message, fs[0].Fix, fs[0].Code, fs[0].Severity = a, b, a, api.Severity(b)
		var buf bytes.Buffer
		require.NoError(t, render(&buf, build(s, fs, true)))
		require.True(t, utf8.Valid(buf.Bytes()) || !utf8.ValidString(a+b), "page not UTF-8")
		d := parseDOM(t, &buf)
		assertInert(t, d)
		require.Len(t, d.withClass("td-row"), len(s.TrustDomains))
		require.Len(t, d.withClass("finding"), len(fs))
		require.NotNil(t, d.byID("today-line"))
	})
}
