package authn

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func FuzzBootstrapTokens(f *testing.F) {
	for _, seed := range []string{
		"",
		"# comment\n\n",
		tokLaptop + ",spiffe://example.org/laptop/alice\n",
		"\xef\xbb\xbf" + tokLaptop + ",spiffe://example.org/a\r\n" + tokVM + " , spiffe://example.org/b\n",
		tokLaptop + ",spiffe://example.org/a\n" + tokLaptop + ",spiffe://example.org/b\n",
		"spiffe://example.org/a," + tokLaptop + "\n",
		tokLaptop + ",spiffe://other.org/a\n",
		tokLaptop + ",spiffe://example.org\n",
		tokLaptop + ",spiffe://example.org/a,x\n",
		"short,spiffe://example.org/a\n",
		"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln,spiffe://example.org/a\n",
		tokLaptop + "\n",
		",\n",
		tokLaptop + ",spiffe://example.org/a,expires=2026-12-01T10:00:00Z,reusable\n",
		tokLaptop + ",spiffe://example.org/a, reusable ,expires=2026-12-01T10:00:00+02:00\n",
		tokLaptop + ",spiffe://example.org/a,reusable,reusable\n",
		tokLaptop + ",spiffe://example.org/a,expires=" + tokVM + "\n",
		tokLaptop + ",spiffe://example.org/a,\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := parseBootstrapTokens(data, localTD)
		if err != nil {
			// The error never echoes a token: the first field of any line,
			// unless those bytes also appear elsewhere in that line (a
			// SPIFFE ID may be quoted).
			for line := range strings.SplitSeq(string(data), "\n") {
				tok, _, ok := strings.Cut(line, ",")
				tok = strings.Trim(tok, " \t\r\ufeff")
				if !ok || len(tok) < 8 || strings.Count(line, tok) > 1 {
					continue
				}
				if strings.Contains(err.Error(), tok) {
					t.Fatalf("error %q echoes token %q", err, tok)
				}
			}
			return
		}
		seen := map[tokenKey]bool{}
		for _, e := range set.entries {
			if !e.id.MemberOf(localTD) || e.id.Path() == "" {
				t.Fatalf("accepted ID %s", e.id)
			}
			if seen[e.hash] {
				t.Fatal("duplicate token accepted")
			}
			seen[e.hash] = true
			// Options come only from their own fields: reusable never
			// by accident, an expiry always in UTC.
			if e.reusable && !strings.Contains(string(data), "reusable") {
				t.Fatal("reusable without the marker")
			}
			if !e.expires.IsZero() && e.expires.Location() != time.UTC {
				t.Fatalf("expiry %s not in UTC", e.expires)
			}
		}
	})
}

func FuzzParseAuthorization(f *testing.F) {
	for _, seed := range []string{
		"Bearer abc", "bearer abc==", "BEARER\tabc", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz",
		"Bearer a b", "Bearer ===", "  Bearer  tok  ", "", "Bearer tök", "Bearertok",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		tok, err := parseAuthorization(v)
		if err != nil {
			if tok != "" {
				t.Fatal("token returned with an error")
			}
			if len(v) >= 24 {
				// No token echoed: no long run of the input appears.
				if rest := strings.TrimSpace(v); len(rest) >= 24 && strings.Contains(err.Error(), rest[len(rest)-16:]) {
					t.Fatalf("error %q echoes input", err)
				}
			}
			return
		}
		if tok == "" || len(tok) > MaxTokenSize || !isToken68(tok) {
			t.Fatalf("bad token %q accepted", tok)
		}
		again, err := parseAuthorization("Bearer " + tok)
		if err != nil || again != tok {
			t.Fatalf("token %q does not round-trip: %q, %v", tok, again, err)
		}
	})
}

func FuzzPeekJWT(f *testing.F) {
	for _, seed := range []string{
		"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.c2ln",
		"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOiJzb29uIn0.c2ln",
		"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjFlMzAwfQ.c2ln",
		"a.b.c", "..", "opaque-token-0123456789",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		info, err := peekJWT(tok)
		if err != nil {
			return
		}
		if info.expInvalid && !info.exp.IsZero() {
			t.Fatal("exp both invalid and set")
		}
		if !info.exp.IsZero() && (info.exp.Unix() < 0 || info.exp.Unix() > maxExpSeconds) {
			t.Fatalf("exp %s out of range", info.exp)
		}
		_ = info.cacheUntil(epoch, MaxTokenReviewCacheTTL)
	})
}

// checkTokenClaimsSeed is a service account token of default/web for
// example.org that the local checks accept at epoch, exp 1800000000.
const checkTokenClaimsSeed = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsifQ.eyJpc3MiOiJodHRwczovL2t1YmVybmV0ZXMuZGVmYXVsdC5zdmMiLCJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZGVmYXVsdDp3ZWIiLCJhdWQiOlsiZXhhbXBsZS5vcmciXSwiZXhwIjoxODAwMDAwMDAwfQ.c2ln"

// FuzzCheckTokenClaims: the local checks never panic, and a token they
// accept names a service account whose SPIFFE ID can be built.
func FuzzCheckTokenClaims(f *testing.F) {
	for _, seed := range []string{
		checkTokenClaimsSeed,
		"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.c2ln",
		"eyJhbGciOiJSUzI1NiIsImNyaXQiOlsiYjY0Il19.e30.c2ln",
		"a.b.c", "..",
	} {
		f.Add(seed, "example.org")
	}
	f.Fuzz(func(t *testing.T, tok, aud string) {
		if _, err := peekJWT(tok); err != nil {
			return
		}
		lt, ref := checkTokenClaims(tok, aud, epoch)
		if ref != nil {
			if ref.reason == "" || ref.err == nil {
				t.Fatalf("refusal without reason: %+v", ref)
			}
			return
		}
		if _, err := spiffeid.FromSegments(localTD, "ns", lt.ns, "sa", lt.sa); err != nil {
			t.Fatalf("accepted %s/%s: %v", lt.ns, lt.sa, err)
		}
		if !slices.Contains(tokenAlgs, lt.alg) {
			t.Fatalf("accepted alg %q", lt.alg)
		}
		// exp becomes Identity.NotAfter: set, in the future, and no
		// further than kube-apiserver would write it.
		if !lt.exp.After(epoch) || lt.exp.Sub(epoch) > maxTokenAhead {
			t.Fatalf("accepted exp %s at %s", lt.exp, epoch)
		}
	})
}

// The accepted seed of FuzzCheckTokenClaims keeps its exp (1800000000),
// which TokenReview hands on as Identity.NotAfter.
func TestCheckTokenClaimsSeedExp(t *testing.T) {
	lt, ref := checkTokenClaims(checkTokenClaimsSeed, "example.org", epoch)
	require.Nil(t, ref)
	assert.Equal(t, time.Unix(1800000000, 0), lt.exp)
}

// FuzzParseIssuerJWKS: a key set never panics the parser, and what it
// keeps is bounded and usable.
func FuzzParseIssuerJWKS(f *testing.F) {
	for _, seed := range []string{
		`{"keys":[{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0","kid":"a","use":"sig"}]}`,
		`{"keys":[{"kty":"AKP","alg":"ML-DSA-44","pub":"AAAA"}]}`,
		`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}`,
		`{"keys":null}`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		keys, err := ParseJWKS(body)
		if err != nil {
			return
		}
		if len(keys) == 0 || len(keys) > maxIssuerKeys {
			t.Fatalf("%d keys", len(keys))
		}
		for i := range keys {
			if !usableIssuerKey(&keys[i]) {
				t.Fatalf("kept an unusable key %d", i)
			}
		}
		_, _ = jwksPath(body)
	})
}
