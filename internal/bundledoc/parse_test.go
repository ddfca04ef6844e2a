package bundledoc_test

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var td = spiffeid.RequireTrustDomainFromString("example.org")

func TestParseAcceptsAndIgnores(t *testing.T) {
	ca := testca.New(t, "example.org")
	ca2 := testca.New(t, "example.org", testca.Options{KeyType: testca.RSA2048})
	jwtKey := testca.NewKey(t, testca.ECP256).Public()
	edKey := testca.NewKey(t, testca.Ed25519).Public()
	root := x509Element(t, ca.Cert)
	jwtEl := jwk(t, jwtKey, "jwt-svid", "kid-1")

	type want struct {
		x509     int
		jwt      int
		wit      int
		warnings []string // substrings, in order
	}
	tests := []struct {
		name string
		doc  any
		want want
	}{
		{"x509 and jwt", docOf(root, jwtEl), want{x509: 1, jwt: 1}},
		{"empty keys revokes everything", docOf(), want{}},
		{"rsa root", docOf(x509Element(t, ca2.Cert)), want{x509: 1}},
		{"ed25519 jwt key", docOf(jwk(t, edKey, "jwt-svid", "ed")), want{jwt: 1}},
		{"wit-svid kept apart from jwt", docOf(jwtEl, with(jwtEl, "use", "wit-svid")), want{jwt: 1, wit: 1}},
		{"unknown kty", docOf(root, obj{"kty": "AKP", "alg": "ML-DSA-44", "use": "jwt-svid", "kid": "pq", "pub": "AAAA"}),
			want{x509: 1, warnings: []string{`keys[1]: kty "AKP" is not supported; element ignored`}}},
		{"symmetric kty ignored", docOf(obj{"kty": "oct", "use": "jwt-svid", "kid": "s"}),
			want{warnings: []string{`keys[0]: kty "oct" is not supported`}}},
		{"unsupported EC curve", docOf(with(jwtEl, "crv", "secp256k1")), want{warnings: []string{`EC curve "secp256k1" is not supported`}}},
		{"unsupported OKP curve", docOf(obj{"kty": "OKP", "crv": "X25519", "x": "AAAA", "use": "jwt-svid", "kid": "x"}),
			want{warnings: []string{`OKP curve "X25519" is not supported`}}},
		{"unknown use", docOf(with(root, "use", "foo"), jwtEl), want{jwt: 1, warnings: []string{`keys[0]: use "foo" is not supported`}}},
		{"use is case sensitive", docOf(with(root, "use", "X509-SVID")), want{warnings: []string{`use "X509-SVID" is not supported`}}},
		{"missing use", docOf(with(root, "use", nil)), want{warnings: []string{`keys[0]: missing "use"`}}},
		{"empty x5c", docOf(with(root, "x5c", []string{})), want{warnings: []string{`no x5c certificate; element ignored`}}},
		{"missing x5c", docOf(with(root, "x5c", nil)), want{warnings: []string{`no x5c certificate`}}},
		{"only the first x5c certificate is used", docOf(with(root, "x5c", []string{b64(ca.Cert), "not even base64!"})),
			want{x509: 1, warnings: []string{`x5c holds 2 certificates; only the first is used`}}},
		{"kid on x509 entry", docOf(with(root, "kid", "k")), want{x509: 1, warnings: []string{`kid must not be set on an x509-svid element`}}},
		{"duplicate root", docOf(root, root), want{x509: 1, warnings: []string{`keys[1]: duplicate x509-svid authority`}}},
		{"x5c on jwt entry", docOf(with(jwtEl, "x5c", []string{b64(ca.Cert)})), want{jwt: 1, warnings: []string{`x5c on a jwt-svid element is ignored`}}},
		{"unknown top-level members", with(docOf(root), "extension", obj{"a": 1}), want{x509: 1}},
		{"rsa 8192 accepted, with an interop warning", docOf(jwk(t, fakeRSA(t, 8192), "jwt-svid", "big")),
			want{jwt: 1, warnings: []string{`keys[0]: RSA key of 8192 bits: go-spiffe and SPIRE refuse keys over 4096 bits`}}},
		{"rsa 4096 without warning", docOf(jwk(t, fakeRSA(t, 4096), "jwt-svid", "big")), want{jwt: 1}},
		{"same kid in jwt and wit", docOf(jwtEl, with(jwtEl, "use", "wit-svid")), want{jwt: 1, wit: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, warnings, err := bundledoc.Parse(td, mustJSON(t, tt.doc))
			require.NoError(t, err)
			assert.Equal(t, td, b.TrustDomain())
			assert.Len(t, b.X509Authorities(), tt.want.x509)
			assert.Len(t, b.JWTAuthorities(), tt.want.jwt)
			assert.Len(t, b.WITAuthorities(), tt.want.wit)
			require.Len(t, warnings, len(tt.want.warnings), "warnings: %v", warnings)
			for i, w := range tt.want.warnings {
				assert.Contains(t, warnings[i].String(), w)
			}
		})
	}
}

func b64(c *x509.Certificate) string { return base64.StdEncoding.EncodeToString(c.Raw) }

func TestParseRefuses(t *testing.T) {
	ca := testca.New(t, "example.org")
	root := x509Element(t, ca.Cert)
	leaf, _ := ca.Issue(t, spiffeid.RequireFromPath(td, "/w"))
	noCertSign := testca.New(t, "example.org", testca.Options{Mutate: func(c *x509.Certificate) {
		c.KeyUsage = x509.KeyUsageDigitalSignature
	}})
	notCA := testca.New(t, "example.org", testca.Options{Mutate: func(c *x509.Certificate) { c.IsCA = false }})
	other := testca.New(t, "example.org")
	jwtEl := jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", "kid-1")
	rsa1024 := jwk(t, fakeRSA(t, 1024), "jwt-svid", "small")
	rsa2047 := jwk(t, fakeRSA(t, 2047), "jwt-svid", "small")
	rsa8193 := jwk(t, fakeRSA(t, 8193), "jwt-svid", "huge")

	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"keys missing", `{"spiffe_sequence":1}`, `missing "keys"`},
		{"keys null", `{"keys":null}`, `"keys" must be an array, got null`},
		{"keys not an array", `{"keys":{}}`, `"keys" must be an array, got an object`},
		{"keys in other case", `{"KEYS":[]}`, `member "KEYS" is a case variant of "keys"`},
		{"bundle map given as bundle", `{"trust_domains":{}}`, `this is a SPIFFE bundle map`},
		{"not an object", `[]`, `bundle document must be a JSON object`},
		{"empty", ``, `empty or truncated`},
		{"truncated", `{"keys":[`, `empty or truncated`},
		{"element not an object", `{"keys":[1]}`, `keys[0]: element must be a JSON object, got a number`},
		{"leaf as root", jsonDoc(t, root, x509Element(t, leaf)), `keys[1]: x5c certificate is not a CA`},
		{"CA without keyCertSign", jsonDoc(t, x509Element(t, noCertSign.Cert)), `keys[0]: x5c certificate is not a CA (keyUsage keyCertSign required)`},
		{"CA flag unset", jsonDoc(t, x509Element(t, notCA.Cert)), `keys[0]: x5c certificate is not a CA (basicConstraints`},
		{"x5c key differs from JWK", jsonDoc(t, with(root, "x5c", []string{b64(other.Cert)})), `keys[0]: x5c certificate public key does not match the JWK key`},
		{"x5c base64url", jsonDoc(t, with(root, "x5c", []string{base64.URLEncoding.EncodeToString(ca.Cert.Raw) + "_-"})), `x5c[0] is not standard base64`},
		{"x5c garbage", jsonDoc(t, with(root, "x5c", []string{"AAAA"})), `x5c[0] is not a valid certificate`},
		{"x5c not strings", jsonDoc(t, with(root, "x5c", []int{1})), `x5c must be an array of strings`},
		{"jwt without kid", jsonDoc(t, with(jwtEl, "kid", nil)), `keys[0]: jwt-svid element has no kid`},
		{"jwt empty kid", jsonDoc(t, with(jwtEl, "kid", "")), `jwt-svid element has no kid`},
		{"wit without kid", jsonDoc(t, with(jwtEl, "kid", nil, "use", "wit-svid")), `wit-svid element has no kid`},
		{"duplicate kid", jsonDoc(t, root, jwtEl, jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", "kid-1")), `keys[2]: duplicate kid "kid-1" (also keys[1])`},
		{"duplicate identical kid", jsonDoc(t, jwtEl, jwtEl), `keys[1]: duplicate kid "kid-1"`},
		{"private key in element", jsonDoc(t, with(jwtEl, "d", "AAAA")), `keys[0]: element contains private key material ("d")`},
		{"symmetric key material even with unknown kty", jsonDoc(t, obj{"kty": "oct", "use": "jwt-svid", "kid": "h", "k": "c2VjcmV0"}), `keys[0]: element contains private key material ("k")`},
		{"missing kty", jsonDoc(t, with(jwtEl, "kty", nil)), `keys[0]: missing "kty"`},
		{"empty kty", jsonDoc(t, with(jwtEl, "kty", "")), `keys[0]: missing "kty"`},
		{"rsa n padded", jsonDoc(t, with(rsa1024, "n", jwk(t, fakeRSA(t, 2048), "", "")["n"].(string)+"=")), `"n" is not unpadded base64url`},
		{"rsa exponent over 32 bits", jsonDoc(t, with(rsa1024, "n", jwk(t, fakeRSA(t, 2048), "", "")["n"], "e", "gAAAAQ")), `RSA public exponent 2147483649 is invalid`},
		{"rsa exponent too long", jsonDoc(t, with(rsa1024, "n", jwk(t, fakeRSA(t, 2048), "", "")["n"], "e", "AQAAAAAB")), `RSA exponent must be 1 to 4 bytes`},
		{"x5c with line breaks", jsonDoc(t, with(root, "x5c", []string{b64(ca.Cert)[:10] + "\r\n" + b64(ca.Cert)[10:]})), `contains a line break`},
		{"member names differing in case", `{"keys":[],"KEYS":[]}`, `members "keys" and "KEYS" in $ differ only in case`},
		{"member names folding with long s", "{\"keys\":[],\"key\u017f\":[]}", `differ only in case`},
		{"case-folded sequence", `{"keys":[],"spiffe_sequence":1,"Spiffe_Sequence":99}`, `differ only in case`},
		{"case variant alone", `{"keys":[],"spiffe_seqUenCe":7}`, `member "spiffe_seqUenCe" is a case variant of "spiffe_sequence"`},
		{"case variant of keys", `{"Keys":[]}`, `member "Keys" is a case variant of "keys"`},
		{"case variant in element", `{"keys":[{"use":"jwt-svid","kty":"EC","Kid":"a"}]}`, `keys[0]: member "Kid" is a case variant of "kid"`},
		{"case-folded element members", `{"keys":[{"use":"jwt-svid","USE":"x509-svid"}]}`, `differ only in case`},
		{"lone surrogate", `{"keys":[],"x":"\ud800"}`, `invalid \u escape`},
		{"lone surrogate in member name", `{"keys":[],"\udc00":1}`, `invalid \u escape`},
		{"rsa 1024", jsonDoc(t, rsa1024), `keys[0]: RSA key of 1024 bits is outside the accepted 2048–8192`},
		{"rsa 2047", jsonDoc(t, rsa2047), `RSA key of 2047 bits`},
		{"rsa 8193", jsonDoc(t, rsa8193), `RSA key of 8193 bits`},
		{"rsa even exponent", jsonDoc(t, with(rsa1024, "n", jwk(t, fakeRSA(t, 2048), "", "")["n"], "e", "AQAA")), `RSA public exponent 65536 is invalid`},
		{"EC point off curve", jsonDoc(t, with(jwtEl, "y", jwtEl["x"])), `keys[0]: invalid JWK`},
		{"kty not a string", jsonDoc(t, with(jwtEl, "kty", 1)), `"kty" must be a string, got a number`},
		{"use not a string", jsonDoc(t, with(jwtEl, "use", true)), `"use" must be a string, got a boolean`},
		{"sequence negative", `{"keys":[],"spiffe_sequence":-1}`, `spiffe_sequence must be an unsigned 64-bit integer, got -1`},
		{"sequence float", `{"keys":[],"spiffe_sequence":1.0}`, `spiffe_sequence must be an unsigned 64-bit integer, got 1.0`},
		{"sequence exponent", `{"keys":[],"spiffe_sequence":1e3}`, `got 1e3`},
		{"sequence string", `{"keys":[],"spiffe_sequence":"5"}`, `got "5"`},
		{"sequence null", `{"keys":[],"spiffe_sequence":null}`, `got null`},
		{"sequence overflow", `{"keys":[],"spiffe_sequence":18446744073709551616}`, `(out of range)`},
		{"refresh hint negative", `{"keys":[],"spiffe_refresh_hint":-300}`, `spiffe_refresh_hint must be a non-negative integer number of seconds, got -300`},
		{"refresh hint float", `{"keys":[],"spiffe_refresh_hint":300.5}`, `got 300.5`},
		{"refresh hint string", `{"keys":[],"spiffe_refresh_hint":"5m"}`, `got "5m"`},
		{"refresh hint beyond a Duration", `{"keys":[],"spiffe_refresh_hint":9223372037}`, `spiffe_refresh_hint 9223372037 seconds is too large`},
		{"trailing data", `{"keys":[]}{"keys":[]}`, `unexpected data after the JSON document`},
		{"trailing garbage", `{"keys":[]} x`, `unexpected data after the JSON document`},
		{"duplicate top-level member", `{"keys":[],"keys":[]}`, `duplicate member "keys" in $`},
		{"duplicate sequence", `{"keys":[],"spiffe_sequence":1,"spiffe_sequence":2}`, `duplicate member "spiffe_sequence"`},
		{"duplicate member in element", `{"keys":[{"use":"jwt-svid","use":"x509-svid"}]}`, `duplicate member "use" in $."keys"[0]`},
		{"invalid UTF-8", "{\"keys\":[],\"x\":\"\xff\"}", `not valid UTF-8 (first bad byte at offset 16)`},
		{"nesting bomb", `{"keys":[],"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, `nests deeper than 32 levels`},
		{"invalid JSON", `{"keys":[],}`, `invalid JSON at offset`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, warnings, err := bundledoc.Parse(td, []byte(tt.doc))
			require.Error(t, err)
			assert.Nil(t, b)
			assert.Nil(t, warnings)
			assert.Contains(t, err.Error(), tt.want)
			assert.True(t, strings.HasPrefix(err.Error(), "bundledoc: "), err.Error())
		})
	}
}

func TestParseRefusesEveryPrivateMember(t *testing.T) {
	el := jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", "k")
	for _, name := range []string{"d", "p", "q", "dp", "dq", "qi", "oth", "k", "priv"} {
		_, _, err := bundledoc.Parse(td, []byte(jsonDoc(t, with(el, name, "AAAA"))))
		assert.ErrorContains(t, err, fmt.Sprintf("private key material (%q)", name))
	}
}

func TestParseElementErrorIndex(t *testing.T) {
	ca := testca.New(t, "example.org")
	leaf, _ := ca.Issue(t, spiffeid.RequireFromPath(td, "/w"))
	root := x509Element(t, ca.Cert)
	doc := jsonDoc(t, root, with(root, "use", "foo"), jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", "a"), x509Element(t, leaf))
	_, _, err := bundledoc.Parse(td, []byte(doc))
	require.Error(t, err)
	assert.Equal(t, "bundledoc: keys[3]: x5c certificate is not a CA (basicConstraints CA=true required)", err.Error())
	var ee *bundledoc.ElementError
	require.True(t, errors.As(err, &ee))
	assert.Equal(t, 3, ee.Index)
}

func TestParseSequenceAndHint(t *testing.T) {
	b, _, err := bundledoc.Parse(td, []byte(`{"keys":[],"spiffe_sequence":18446744073709551615,"spiffe_refresh_hint":300}`))
	require.NoError(t, err)
	seq, ok := b.SequenceNumber()
	require.True(t, ok)
	assert.Equal(t, uint64(18446744073709551615), seq)
	hint, ok := b.RefreshHint()
	require.True(t, ok)
	assert.Equal(t, 5*time.Minute, hint)

	b, _, err = bundledoc.Parse(td, []byte(`{"keys":[],"spiffe_sequence":0}`))
	require.NoError(t, err)
	seq, ok = b.SequenceNumber()
	assert.True(t, ok)
	assert.Zero(t, seq)
	_, ok = b.RefreshHint()
	assert.False(t, ok, "absent hint must stay absent so callers apply the spec default")
}

func TestParseRequiresTrustDomain(t *testing.T) {
	_, _, err := bundledoc.Parse(spiffeid.TrustDomain{}, []byte(`{"keys":[]}`))
	assert.ErrorContains(t, err, "trust domain is required")
}

func TestParseForeignSPIFFEIDWarns(t *testing.T) {
	other := testca.New(t, "other.org")
	b, warnings, err := bundledoc.Parse(td, []byte(jsonDoc(t, x509Element(t, other.Cert))))
	require.NoError(t, err)
	assert.Len(t, b.X509Authorities(), 1)
	require.Len(t, warnings, 1)
	assert.Equal(t, `keys[0]: x5c certificate names trust domain "other.org" but the bundle is for "example.org"`, warnings[0].String())
}

func TestRead(t *testing.T) {
	doc := []byte(`{"keys":[],"spiffe_sequence":7}`)
	t.Run("within limit", func(t *testing.T) {
		b, _, err := bundledoc.Read(td, bytes.NewReader(doc), int64(len(doc)))
		require.NoError(t, err)
		seq, _ := b.SequenceNumber()
		assert.Equal(t, uint64(7), seq)
	})
	t.Run("one byte over errors instead of truncating", func(t *testing.T) {
		_, _, err := bundledoc.Read(td, bytes.NewReader(doc), int64(len(doc)-1))
		require.ErrorIs(t, err, bundledoc.ErrTooLarge)
		assert.Contains(t, err.Error(), "more than 30 bytes")
	})
	t.Run("default cap", func(t *testing.T) {
		big := append([]byte(`{"keys":[],"pad":"`), bytes.Repeat([]byte("a"), bundledoc.DefaultMaxSize)...)
		big = append(big, `"}`...)
		_, _, err := bundledoc.Read(td, bytes.NewReader(big), 0)
		require.ErrorIs(t, err, bundledoc.ErrTooLarge)
	})
	t.Run("reader error", func(t *testing.T) {
		_, _, err := bundledoc.Read(td, errReader{}, 0)
		assert.ErrorContains(t, err, "read document: boom")
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestTrustDomainName(t *testing.T) {
	for _, ok := range []string{"example.org", "a_b-c.d", "localhost"} {
		_, err := bundledoc.TrustDomainName(ok)
		assert.NoError(t, err, ok)
	}
	for _, bad := range []string{"", "Example.org", "spiffe://example.org", "example.org:443", "example.org/path", "exa mple",
		".", "..", "a..b", "example.org.", ".example.org", strings.Repeat("a", 256)} {
		_, err := bundledoc.TrustDomainName(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseTrustDomain(t *testing.T) {
	for in, want := range map[string]string{"example.org": "example.org", "spiffe://example.org": "example.org", "spiffe://a_b-c.d": "a_b-c.d"} {
		td, err := bundledoc.ParseTrustDomain(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, td.Name(), in)
		}
	}
	for in, want := range map[string]string{
		"":                          "is empty",
		"spiffe://":                 "is empty",
		"spiffe://example.org/ns/a": "is a SPIFFE ID with a path; a trust domain is written example.org or spiffe://example.org",
		"spiffe://example.org/":     "is a SPIFFE ID with a path",
		"spiffe://example.org?x":    "is a SPIFFE ID with a path",
		"spiffe://example.org:443":  "must be a bare trust-domain name",
		"spiffe://Example.org":      "trust domain characters are limited",
		"SPIFFE://example.org":      "must be a trust domain such as example.org or spiffe://example.org, without another scheme, port or path",
		"https://example.org":       "must be a trust domain such as example.org or spiffe://example.org",
		"example.org:443":           "without another scheme, port or path",
		"example.org/x":             "without another scheme, port or path",
		"spiffe://a..b":             "has an empty label",
		"spiffe://spiffe://a":       "is a SPIFFE ID with a path",
	} {
		_, err := bundledoc.ParseTrustDomain(in)
		assert.ErrorContains(t, err, want, in)
	}
}

// FuzzParseTrustDomain: whatever it accepts is a trust domain whose name
// TrustDomainName accepts, written as given or as its SPIFFE ID.
func FuzzParseTrustDomain(f *testing.F) {
	for _, s := range []string{"example.org", "spiffe://example.org", "spiffe://example.org/x", "spiffe://", "https://a", "a:1", "spiffe://a..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		td, err := bundledoc.ParseTrustDomain(s)
		if err != nil {
			return
		}
		if s != td.Name() && s != td.IDString() {
			t.Fatalf("%q parsed as %q", s, td.Name())
		}
		if _, err := bundledoc.TrustDomainName(td.Name()); err != nil {
			t.Fatalf("%q parsed as %q, which TrustDomainName refuses: %v", s, td.Name(), err)
		}
	})
}

func jsonDoc(t testing.TB, keys ...obj) string {
	return string(mustJSON(t, docOf(keys...)))
}
