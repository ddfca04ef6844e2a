package bundledoc_test

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// thumb is a valid x5t#S256 for a made-up certificate.
func thumb(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

var revExp = time.Unix(1767225600, 0).UTC()

func TestRevocationsRoundTrip(t *testing.T) {
	b := fullBundle(t)
	gone := testca.New(t, "example.org").Cert
	revs := []bundledoc.Revocation{
		{Use: bundledoc.UseJWTSVID, KID: "old<kid>", NotAfter: revExp},
		bundledoc.RevokeX509(gone),
		{Use: bundledoc.UseX509SVID, X5TS256: thumb("intermediate"), NotAfter: revExp.Add(time.Hour)},
	}
	doc, err := bundledoc.MarshalWithRevocations(b, revs)
	require.NoError(t, err)

	got, err := bundledoc.ParseRevocations(doc)
	require.NoError(t, err)
	want, err := bundledoc.Revocations(revs)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	require.Len(t, want, 3)
	assert.Equal(t, []string{bundledoc.UseJWTSVID, bundledoc.UseX509SVID, bundledoc.UseX509SVID}, []string{want[0].Use, want[1].Use, want[2].Use}, "sorted by use")
	assert.Contains(t, string(doc), `"x5t#S256":"`+bundledoc.X509Thumbprint(gone)+`","exp":`+fmt.Sprint(gone.NotAfter.Unix()))

	// The member changes nothing else: the bundle parses as before, here
	// and in go-spiffe, which ignores the member.
	parsed, warnings, err := bundledoc.Parse(td, doc)
	require.NoError(t, err)
	assert.Empty(t, warnings)
	assert.True(t, b.Equal(parsed))
	theirs, err := spiffebundle.Parse(td, doc)
	require.NoError(t, err)
	assert.True(t, b.Equal(theirs))

	// Same input in another order: same bytes, so the same ETag.
	again, err := bundledoc.MarshalWithRevocations(b, []bundledoc.Revocation{revs[2], revs[1], revs[0], revs[1]})
	require.NoError(t, err)
	assert.Equal(t, string(doc), string(again))
}

func TestRevocationsSortedAndMerged(t *testing.T) {
	got, err := bundledoc.Revocations([]bundledoc.Revocation{
		{Use: bundledoc.UseX509SVID, X5TS256: thumb("b"), NotAfter: revExp},
		{Use: bundledoc.UseJWTSVID, KID: "k", NotAfter: revExp},
		{Use: bundledoc.UseJWTSVID, KID: "k", NotAfter: revExp.Add(time.Hour)},
	})
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, bundledoc.UseJWTSVID, got[0].Use)
	assert.Equal(t, revExp.Add(time.Hour), got[0].NotAfter, "the later exp is kept")
	assert.Equal(t, bundledoc.UseX509SVID, got[1].Use)
}

func TestMarshalWithoutRevocationsIsMarshal(t *testing.T) {
	b := fullBundle(t)
	plain, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	doc, err := bundledoc.MarshalWithRevocations(b, nil)
	require.NoError(t, err)
	assert.Equal(t, string(plain), string(doc))
	revs, err := bundledoc.ParseRevocations(doc)
	require.NoError(t, err)
	assert.Nil(t, revs)
}

func TestMarshalWithRevocationsRefuses(t *testing.T) {
	b := fullBundle(t)
	root := b.X509Authorities()[0]
	for name, tc := range map[string]struct {
		revs []bundledoc.Revocation
		want string
	}{
		"carried root":  {[]bundledoc.Revocation{bundledoc.RevokeX509(root)}, "still carries"},
		"carried kid":   {[]bundledoc.Revocation{{Use: bundledoc.UseJWTSVID, KID: "aa", NotAfter: revExp}}, "still carries"},
		"no exp":        {[]bundledoc.Revocation{{Use: bundledoc.UseJWTSVID, KID: "x"}}, "exp"},
		"bad thumb":     {[]bundledoc.Revocation{{Use: bundledoc.UseX509SVID, X5TS256: "abc", NotAfter: revExp}}, "want a SHA-256"},
		"unknown use":   {[]bundledoc.Revocation{{Use: "wit-svid", KID: "x", NotAfter: revExp}}, "use"},
		"kid and thumb": {[]bundledoc.Revocation{{Use: bundledoc.UseX509SVID, X5TS256: thumb("a"), KID: "x", NotAfter: revExp}}, "kid must not"},
		"too many":      {manyRevocations(bundledoc.MaxRevocations + 1), "more than the 256"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := bundledoc.MarshalWithRevocations(b, tc.revs)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func manyRevocations(n int) []bundledoc.Revocation {
	out := make([]bundledoc.Revocation, n)
	for i := range out {
		out[i] = bundledoc.Revocation{Use: bundledoc.UseJWTSVID, KID: fmt.Sprint("k", i), NotAfter: revExp}
	}
	return out
}

func TestRevokedAuthority(t *testing.T) {
	b := fullBundle(t)
	root := b.X509Authorities()[1]
	r, ok := bundledoc.RevokedAuthority(b, []bundledoc.Revocation{{Use: bundledoc.UseJWTSVID, KID: "nope", NotAfter: revExp}, bundledoc.RevokeX509(root)})
	require.True(t, ok)
	assert.Equal(t, bundledoc.X509Thumbprint(root), r.X5TS256)
	r, ok = bundledoc.RevokedAuthority(b, []bundledoc.Revocation{{Use: bundledoc.UseJWTSVID, KID: "mm", NotAfter: revExp}})
	require.True(t, ok)
	assert.Equal(t, "mm", r.KID)
	// A WIT key shares no namespace with a revoked JWT kid.
	_, ok = bundledoc.RevokedAuthority(b, []bundledoc.Revocation{{Use: bundledoc.UseJWTSVID, KID: "w1", NotAfter: revExp}})
	assert.False(t, ok)
}

func TestParseRevocations(t *testing.T) {
	x := thumb("x")
	for _, tc := range []struct {
		name, member string
		want         []bundledoc.Revocation // nil with wantErr ""
		wantErr      string
	}{
		{name: "absent", member: ""},
		{name: "empty", member: `[]`},
		{name: "x509", member: `[{"use":"x509-svid","x5t#S256":"` + x + `","exp":1767225600}]`,
			want: []bundledoc.Revocation{{Use: bundledoc.UseX509SVID, X5TS256: x, NotAfter: revExp}}},
		{name: "jwt with unknown member", member: `[{"use":"jwt-svid","kid":"k","exp":1767225600,"reason":"key compromise"}]`,
			want: []bundledoc.Revocation{{Use: bundledoc.UseJWTSVID, KID: "k", NotAfter: revExp}}},
		{name: "unknown and missing use skipped", member: `[{"use":"wit-svid","kid":"w","exp":1},{"kid":"k"},{"use":"jwt-svid","kid":"k","exp":1767225600}]`,
			want: []bundledoc.Revocation{{Use: bundledoc.UseJWTSVID, KID: "k", NotAfter: revExp}}},
		{name: "not an array", member: `{}`, wantErr: "must be an array"},
		{name: "null", member: `null`, wantErr: "must be an array"},
		{name: "entry not an object", member: `["x"]`, wantErr: "trustbridge_revoked[0]: entry must be a JSON object"},
		{name: "padded thumb", member: `[{"use":"x509-svid","x5t#S256":"` + x + `=","exp":1}]`, wantErr: "not unpadded base64url"},
		{name: "std base64 thumb", member: `[{"use":"x509-svid","x5t#S256":"` + strings.Repeat("+", 43) + `","exp":1}]`, wantErr: "not base64url"},
		{name: "short thumb", member: `[{"use":"x509-svid","x5t#S256":"AAAA","exp":1}]`, wantErr: "holds 3 bytes"},
		{name: "missing thumb", member: `[{"use":"x509-svid","exp":1}]`, wantErr: "no x5t#S256"},
		{name: "empty kid", member: `[{"use":"jwt-svid","kid":"","exp":1}]`, wantErr: "no kid"},
		{name: "missing exp", member: `[{"use":"jwt-svid","kid":"k"}]`, wantErr: "has no exp"},
		{name: "negative exp", member: `[{"use":"jwt-svid","kid":"k","exp":-1}]`, wantErr: "exp must be a Unix time"},
		{name: "zero exp", member: `[{"use":"jwt-svid","kid":"k","exp":0}]`, wantErr: "not a Unix time between"},
		{name: "float exp", member: `[{"use":"jwt-svid","kid":"k","exp":1.5}]`, wantErr: "exp must be"},
		{name: "bad one fails all", member: `[{"use":"jwt-svid","kid":"k","exp":1},{"use":"jwt-svid","kid":"","exp":1}]`, wantErr: "trustbridge_revoked[1]"},
		{name: "use not a string", member: `[{"use":1,"kid":"k","exp":1}]`, wantErr: `"use" must be a string`},
		{name: "case variant member", member: `[{"use":"jwt-svid","KID":"k","exp":1}]`, wantErr: "case variant"},
		{name: "too many", member: "[" + strings.Repeat(`{"use":"jwt-svid","kid":"k","exp":1},`, bundledoc.MaxRevocations) + `{}]`, wantErr: "257 entries, more than the 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := `{"keys":[]}`
			if tc.member != "" {
				doc = `{"keys":[],"trustbridge_revoked":` + tc.member + `}`
			}
			got, err := bundledoc.ParseRevocations([]byte(doc))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestParseRevocationsDocumentRules(t *testing.T) {
	for name, doc := range map[string]string{
		"case variant of the member": `{"keys":[],"Trustbridge_Revoked":[]}`,
		"duplicate member":           `{"keys":[],"trustbridge_revoked":[],"trustbridge_revoked":[]}`,
		"not an object":              `[]`,
		"trailing data":              `{"keys":[]} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := bundledoc.ParseRevocations([]byte(doc))
			assert.Error(t, err)
		})
	}
}
