package oidctest

import (
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"

	jose "github.com/go-jose/go-jose/v4"
)

// TokenLifetime is the exp of StandardClaims, after its iat.
const TokenLifetime = 10 * 60 // seconds

// StandardClaims returns iss (the issuer URL), sub, aud (a string for one
// audience, a list otherwise), iat and nbf (now) and exp (now plus
// TokenLifetime), now from WithNow. Callers add or change claims.
func (i *Issuer) StandardClaims(sub string, aud ...string) map[string]any {
	now := i.now().Unix()
	c := map[string]any{"iss": i.url, "sub": sub, "iat": now, "nbf": now, "exp": now + TokenLifetime}
	if len(aud) == 1 {
		c["aud"] = aud[0]
	} else {
		c["aud"] = aud
	}
	return c
}

// Mint signs claims with the current key: the issuer's algorithm, its
// kid, typ JWT.
func (i *Issuer) Mint(claims map[string]any) string {
	i.tb.Helper()
	return i.MintWith(nil, claims)
}

// MintWith signs claims like Mint, with header entries set or replaced
// ("alg" picks the algorithm; a nil value removes an entry, e.g. "kid")
// and, when given, key instead of the current key (a stranger's key, for
// signatures that must not verify; the kid stays the current one's
// unless header says otherwise).
func (i *Issuer) MintWith(header map[string]any, claims map[string]any, key ...crypto.Signer) string {
	i.tb.Helper()
	cur := i.current()
	priv := cur.priv
	if len(key) > 0 {
		priv = key[0]
	}
	alg := i.alg
	if a, ok := header["alg"].(string); ok {
		alg = jose.SignatureAlgorithm(a)
	}
	return i.sign(jose.SigningKey{Algorithm: alg, Key: priv}, cur.kid, header, claims)
}

// HMACWithPublicKey signs claims with HS256 keyed by the current public
// key's PEM (PKIX) bytes, with its kid: the key-confusion attack on
// verifiers that hand "the key" to whatever alg the header names.
func (i *Issuer) HMACWithPublicKey(claims map[string]any) string {
	i.tb.Helper()
	cur := i.current()
	der, err := x509.MarshalPKIXPublicKey(cur.priv.Public())
	if err != nil {
		i.tb.Fatalf("oidctest: %v", err)
	}
	secret := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	return i.sign(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, cur.kid, nil, claims)
}

// NoneAlg returns an unsigned token, alg "none" with the current kid and
// an empty signature (RFC 7519 §6).
func (i *Issuer) NoneAlg(claims map[string]any) string {
	i.tb.Helper()
	h, err := json.Marshal(map[string]any{"alg": "none", "typ": "JWT", "kid": i.current().kid})
	if err != nil {
		i.tb.Fatalf("oidctest: %v", err)
	}
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(i.payload(claims)) + "."
}

func (i *Issuer) sign(key jose.SigningKey, kid string, header, claims map[string]any) string {
	i.tb.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid)
	for k, v := range header {
		switch {
		case k == "alg":
		case v == nil:
			delete(opts.ExtraHeaders, jose.HeaderKey(k))
		default:
			opts.WithHeader(jose.HeaderKey(k), v)
		}
	}
	signer, err := jose.NewSigner(key, opts)
	if err != nil {
		i.tb.Fatalf("oidctest: signer: %v", err)
	}
	jws, err := signer.Sign(i.payload(claims))
	if err != nil {
		i.tb.Fatalf("oidctest: sign: %v", err)
	}
	token, err := jws.CompactSerialize()
	if err != nil {
		i.tb.Fatalf("oidctest: serialize: %v", err)
	}
	return token
}

func (i *Issuer) payload(claims map[string]any) []byte {
	i.tb.Helper()
	b, err := json.Marshal(claims)
	if err != nil {
		i.tb.Fatalf("oidctest: claims: %v", err)
	}
	return b
}
