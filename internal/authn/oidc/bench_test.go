package oidc

import (
	"context"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

// BenchmarkAuthenticate against its baseline, BenchmarkSignatureOnly (the
// bare go-jose signature check every accepted token needs): the ratio is
// what parsing, claim checks, rules and the template add.
func BenchmarkAuthenticate(b *testing.B) {
	f := newFixture(b)
	token := sign(b, "ES256", "ec-1", nil, ciClaims())
	ctx := context.Background()
	for b.Loop() {
		if _, err := f.a.Authenticate(ctx, bearer(token)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSignatureOnly(b *testing.B) {
	token := sign(b, "ES256", "ec-1", nil, ciClaims())
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
}

// BenchmarkRefusedHeader: a token the issuer may not have signed (alg
// none) is refused before any key or signature work.
func BenchmarkRefusedHeader(b *testing.B) {
	f := newFixture(b)
	token := unsigned(`{"alg":"none"}`, string(payloadBytes(b, ciClaims())), nil)
	ctx := context.Background()
	for b.Loop() {
		if _, err := f.a.Authenticate(ctx, bearer(token)); err == nil {
			b.Fatal("accepted")
		}
	}
}
