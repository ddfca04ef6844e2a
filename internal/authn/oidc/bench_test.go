package oidc

import (
	"context"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

// BenchmarkAuthenticate measures an accepted ES256 token through the
// whole authenticator (header, key lookup, signature, claims, rules,
// template) against its baseline, the bare go-jose signature check every
// accepted token needs: the ratio is what the rest adds. refused-alg-none
// is a token refused from its header alone, before any key or signature
// work: what an unauthenticated caller's junk costs.
func BenchmarkAuthenticate(b *testing.B) {
	token := sign(b, "ES256", "ec-1", nil, ciClaims())
	ctx := context.Background()
	b.Run("baseline:signature-only", func(b *testing.B) {
		key := publicKeys()[1]
		for b.Loop() {
			jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.ES256})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := jws.Verify(&key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("authenticate", func(b *testing.B) {
		f := newFixture(b)
		for b.Loop() {
			if _, err := f.a.Authenticate(ctx, bearer(token)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("refused-alg-none", func(b *testing.B) {
		f := newFixture(b)
		none := unsigned(`{"alg":"none"}`, string(payloadBytes(b, ciClaims())), nil)
		for b.Loop() {
			if _, err := f.a.Authenticate(ctx, bearer(none)); err == nil {
				b.Fatal("accepted")
			}
		}
	})
}
