package bundledoc_test

import (
	"crypto"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// fullBundle has every kind of authority, a sequence and a refresh hint.
func fullBundle(t testing.TB) *spiffebundle.Bundle {
	t.Helper()
	b := spiffebundle.New(td)
	b.AddX509Authority(testca.New(t, "example.org").Cert)
	b.AddX509Authority(testca.New(t, "example.org", testca.Options{KeyType: testca.RSA2048}).Cert)
	for _, kid := range []string{"zz", "aa", "mm"} {
		require.NoError(t, b.AddJWTAuthority(kid, testca.NewKey(t, testca.ECP256).Public()))
	}
	require.NoError(t, b.AddJWTAuthority("rsa", testca.NewKey(t, testca.RSA2048).Public()))
	require.NoError(t, b.AddJWTAuthority("ed", testca.NewKey(t, testca.Ed25519).Public()))
	require.NoError(t, b.AddWITAuthority("w1", testca.NewKey(t, testca.ECP384).Public()))
	b.SetSequenceNumber(42)
	b.SetRefreshHint(5 * time.Minute)
	return b
}

func TestMarshalRoundTrip(t *testing.T) {
	b := fullBundle(t)
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	got, warnings, err := bundledoc.Parse(td, doc)
	require.NoError(t, err)
	assert.Empty(t, warnings)
	assert.True(t, b.Equal(got), "round trip changed the bundle:\n%s", doc)
}

func TestMarshalIsDeterministic(t *testing.T) {
	b := fullBundle(t)
	first, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	for range 20 {
		// Rebuild the JWT map each time: Go randomizes map iteration, so
		// an unsorted marshal would differ between runs.
		c := spiffebundle.New(td)
		c.SetX509Authorities(b.X509Authorities())
		c.SetJWTAuthorities(b.JWTAuthorities())
		c.SetWITAuthorities(b.WITAuthorities())
		c.SetSequenceNumber(42)
		c.SetRefreshHint(5 * time.Minute)
		again, err := bundledoc.Marshal(c)
		require.NoError(t, err)
		require.Equal(t, string(first), string(again))
	}
}

func TestMarshalShape(t *testing.T) {
	b := fullBundle(t)
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)

	var parsed struct {
		Keys        []map[string]any `json:"keys"`
		Sequence    *uint64          `json:"spiffe_sequence"`
		RefreshHint *int64           `json:"spiffe_refresh_hint"`
	}
	require.NoError(t, json.Unmarshal(doc, &parsed))
	require.NotNil(t, parsed.Sequence)
	assert.Equal(t, uint64(42), *parsed.Sequence)
	require.NotNil(t, parsed.RefreshHint)
	assert.Equal(t, int64(300), *parsed.RefreshHint)

	var order []string
	for _, k := range parsed.Keys {
		use := k["use"].(string)
		require.NotEmpty(t, use, "every element has use")
		switch use {
		case "x509-svid":
			assert.Len(t, k["x5c"], 1, "exactly one x5c certificate")
			assert.NotContains(t, k, "kid", "no kid on x509 entries")
			order = append(order, "x509")
		default:
			assert.NotContains(t, k, "x5c")
			order = append(order, use+":"+k["kid"].(string))
		}
	}
	assert.Equal(t, []string{"x509", "x509", "jwt-svid:aa", "jwt-svid:ed", "jwt-svid:mm", "jwt-svid:rsa", "jwt-svid:zz", "wit-svid:w1"}, order)
	assert.True(t, strings.HasPrefix(string(doc), `{"keys":[`))
}

func TestMarshalOptionalFields(t *testing.T) {
	b := spiffebundle.New(td)
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	assert.Equal(t, `{"keys":[]}`, string(doc))

	b.SetRefreshHint(1500 * time.Millisecond)
	b.SetSequenceNumber(0)
	doc, err = bundledoc.Marshal(b)
	require.NoError(t, err)
	assert.Equal(t, `{"keys":[],"spiffe_sequence":0,"spiffe_refresh_hint":2}`, string(doc), "hints round up, zero sequence is kept")
}

func TestMarshalRefuses(t *testing.T) {
	ca := testca.New(t, "example.org")
	leaf, _ := ca.Issue(t, spiffeid.RequireFromPath(td, "/w"))
	weakCA := testca.New(t, "example.org", testca.Options{KeyType: testca.RSA1024})
	tests := []struct {
		name  string
		build func(*spiffebundle.Bundle)
		want  string
	}{
		{"non-CA authority", func(b *spiffebundle.Bundle) { b.AddX509Authority(leaf) }, "keys[0]: x5c certificate is not a CA"},
		{"weak x509 authority", func(b *spiffebundle.Bundle) { b.AddX509Authority(weakCA.Cert) }, "keys[0]: RSA key of 1024 bits"},
		{"small RSA jwt key", func(b *spiffebundle.Bundle) { _ = b.AddJWTAuthority("k", fakeRSA(t, 1024)) }, `keys[0] (jwt-svid kid "k"): RSA key of 1024 bits`},
		{"unsupported key type", func(b *spiffebundle.Bundle) { _ = b.AddJWTAuthority("k", crypto.PublicKey("nope")) }, "key type string is not supported"},
		{"negative refresh hint", func(b *spiffebundle.Bundle) { b.SetRefreshHint(-time.Second) }, "negative refresh hint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := spiffebundle.New(td)
			tt.build(b)
			_, err := bundledoc.Marshal(b)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	_, err := bundledoc.Marshal(nil)
	assert.ErrorContains(t, err, "nil bundle")
}

func TestMarshalLargeRSA(t *testing.T) {
	// 8192-bit keys are within the spec range; make sure both directions
	// handle them (go-jose alone stops at 4096).
	b := spiffebundle.New(td)
	require.NoError(t, b.AddJWTAuthority("big", fakeRSA(t, 8192)))
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	got, _, err := bundledoc.Parse(td, doc)
	require.NoError(t, err)
	assert.True(t, b.Equal(got))
}

// Interop with go-spiffe, the data model every SPIRE deployment speaks.
func TestInteropWithGoSPIFFE(t *testing.T) {
	t.Run("go-spiffe marshals, we parse", func(t *testing.T) {
		b := fullBundle(t)
		doc, err := b.Marshal()
		require.NoError(t, err)
		got, warnings, err := bundledoc.Parse(td, doc)
		require.NoError(t, err)
		assert.Empty(t, warnings)
		assert.True(t, b.Equal(got))
	})
	t.Run("we marshal, go-spiffe parses", func(t *testing.T) {
		b := fullBundle(t)
		doc, err := bundledoc.Marshal(b)
		require.NoError(t, err)
		got, err := spiffebundle.Parse(td, doc)
		require.NoError(t, err)
		assert.True(t, b.Equal(got))
	})
}

func TestBundleMap(t *testing.T) {
	a := testca.New(t, "a.org")
	bca := testca.New(t, "b.org")
	ba := a.Bundle()
	ba.SetSequenceNumber(3)
	ba.SetRefreshHint(time.Minute)
	bb := bca.Bundle()

	doc, err := bundledoc.MarshalMap([]*spiffebundle.Bundle{bb, ba})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(doc), `{"trust_domains":{"a.org":{"keys":[`), "sorted by trust domain: %s", doc)
	assert.NotContains(t, string(doc), "spiffe_refresh_hint", "producers omit hints in maps")

	got, warnings, err := bundledoc.ParseMap(doc)
	require.NoError(t, err)
	assert.Empty(t, warnings)
	require.Len(t, got, 2)
	assert.Equal(t, "a.org", got[0].TrustDomain().Name())
	seq, ok := got[0].SequenceNumber()
	assert.True(t, ok)
	assert.Equal(t, uint64(3), seq)
	assert.True(t, got[1].Equal(bb))

	_, err = bundledoc.MarshalMap([]*spiffebundle.Bundle{ba, a.Bundle()})
	assert.ErrorContains(t, err, `duplicate trust domain "a.org"`)
}

func TestReadMap(t *testing.T) {
	doc := `{"trust_domains":{"a.org":{"keys":[]}}}`
	got, _, err := bundledoc.ReadMap(strings.NewReader(doc), 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	_, _, err = bundledoc.ReadMap(strings.NewReader(doc), int64(len(doc)-1))
	assert.ErrorIs(t, err, bundledoc.ErrTooLarge)
}

func TestParseMapRules(t *testing.T) {
	ca := testca.New(t, "a.org")
	root := string(mustJSON(t, x509Element(t, ca.Cert)))
	leaf, _ := ca.Issue(t, spiffeid.RequireFromString("spiffe://a.org/w"))
	bad := string(mustJSON(t, x509Element(t, leaf)))

	t.Run("refresh hints inside are ignored", func(t *testing.T) {
		got, _, err := bundledoc.ParseMap([]byte(`{"trust_domains":{"a.org":{"keys":[` + root + `],"spiffe_refresh_hint":"not even a number"}}}`))
		require.NoError(t, err)
		_, ok := got[0].RefreshHint()
		assert.False(t, ok)
	})
	t.Run("warnings name the trust domain", func(t *testing.T) {
		_, warnings, err := bundledoc.ParseMap([]byte(`{"trust_domains":{"a.org":{"keys":[{"kty":"AKP","use":"jwt-svid"}]}}}`))
		require.NoError(t, err)
		require.Len(t, warnings, 1)
		assert.Equal(t, `trust_domains["a.org"]: keys[0]: kty "AKP" is not supported; element ignored`, warnings[0].String())
	})
	t.Run("empty map", func(t *testing.T) {
		got, _, err := bundledoc.ParseMap([]byte(`{"trust_domains":{}}`))
		require.NoError(t, err)
		assert.Empty(t, got)
	})
	refuse := []struct{ name, doc, want string }{
		{"duplicate trust domain", `{"trust_domains":{"a.org":{"keys":[]},"a.org":{"keys":[]}}}`, `duplicate member "a.org" in $."trust_domains"`},
		{"spiffe URI as key", `{"trust_domains":{"spiffe://a.org":{"keys":[]}}}`, `trust_domains["spiffe://a.org"]: invalid trust domain`},
		{"uppercase trust domain", `{"trust_domains":{"A.org":{"keys":[]}}}`, `trust_domains["A.org"]: invalid trust domain: trust domain characters are limited`},
		{"missing trust_domains", `{}`, `missing "trust_domains"`},
		{"bundle given as map", `{"keys":[]}`, `this is a SPIFFE bundle, not a bundle map`},
		{"trust_domains not an object", `{"trust_domains":[]}`, `"trust_domains" must be a JSON object`},
		{"entry not an object", `{"trust_domains":{"a.org":[]}}`, `trust_domains["a.org"]: bundle must be a JSON object`},
		{"entry missing keys", `{"trust_domains":{"a.org":{}}}`, `trust_domains["a.org"]: missing "keys"`},
		{"bad element", `{"trust_domains":{"a.org":{"keys":[` + bad + `]}}}`, `trust_domains["a.org"]: keys[0]: x5c certificate is not a CA`},
		{"trailing data", `{"trust_domains":{}} []`, `unexpected data after the JSON document`},
		{"case variant of trust_domains", `{"trust_domains":{},"Trust_Domains":{"a.org":{"keys":[]}}}`, `differ only in case`},
		{"case variant alone", `{"Trust_Domains":{}}`, `member "Trust_Domains" is a case variant of "trust_domains"`},
	}
	for _, tt := range refuse {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := bundledoc.ParseMap([]byte(tt.doc))
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestMarshalJWKS: a standard JWKS (no "use", no SPIFFE members) sorted by
// key ID, the same bytes for the same keys, that go-spiffe's jwtbundle
// parses back to the same authorities.
func TestMarshalJWKS(t *testing.T) {
	keys := fullBundle(t).JWTAuthorities()
	first, err := bundledoc.MarshalJWKS(keys)
	require.NoError(t, err)
	for range 20 {
		again, err := bundledoc.MarshalJWKS(maps.Clone(keys))
		require.NoError(t, err)
		require.Equal(t, string(first), string(again))
	}
	var doc struct {
		Keys []map[string]any `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(first, &doc))
	var kids []string
	for _, k := range doc.Keys {
		kids = append(kids, k["kid"].(string))
		assert.NotContains(t, k, "use")
	}
	assert.Equal(t, []string{"aa", "ed", "mm", "rsa", "zz"}, kids)
	parsed, err := jwtbundle.Parse(td, first)
	require.NoError(t, err)
	assert.True(t, jwtbundle.FromJWTAuthorities(td, keys).Equal(parsed))

	empty, err := bundledoc.MarshalJWKS(nil)
	require.NoError(t, err)
	assert.JSONEq(t, `{"keys":[]}`, string(empty))
}
