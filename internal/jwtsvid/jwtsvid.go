package jwtsvid

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/cryptosigner"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
)

// MaxTokenBytes bounds a token Validate parses. A JWT-SVID is a few hundred
// bytes; the limit only keeps an unauthenticated caller from making the
// parser decode megabytes.
const MaxTokenBytes = 16 << 10

// MinRSABits is the smallest RSA key Mint signs with.
const MinRSABits = 2048

// Errors of Mint and Validate, for callers that map them to a status.
var (
	ErrInvalidClaims = errors.New("invalid JWT-SVID claims")
	ErrInvalidKey    = errors.New("unsupported JWT signing key")
	ErrInvalidToken  = errors.New("invalid JWT-SVID")
)

// Claims are what a JWT-SVID says: who (sub), for whom (aud), from when
// (iat) until when (exp), and, when Issuer is set, by whom (iss: an OIDC
// issuer URL, checked with ParseIssuer).
type Claims struct {
	Issuer   string
	Subject  spiffeid.ID
	Audience []string
	IssuedAt time.Time
	Expiry   time.Time
}

func (c Claims) check() error {
	switch {
	case c.Subject.IsZero():
		return fmt.Errorf("%w: subject is required", ErrInvalidClaims)
	case len(c.Audience) == 0:
		return fmt.Errorf("%w: at least one audience is required", ErrInvalidClaims)
	case !c.Expiry.After(c.IssuedAt):
		return fmt.Errorf("%w: expiry %s is not after issue time %s", ErrInvalidClaims, c.Expiry.UTC().Format(time.RFC3339), c.IssuedAt.UTC().Format(time.RFC3339))
	}
	for i, a := range c.Audience {
		if a == "" {
			return fmt.Errorf("%w: audience %d is empty", ErrInvalidClaims, i+1)
		}
	}
	if c.Issuer != "" {
		if _, err := ParseIssuer(c.Issuer); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidClaims, err)
		}
	}
	return nil
}

// Algorithm is the JWS algorithm trustbridge signs with for a public key:
// ES256 for P-256, ES384 for P-384, RS256 for RSA of at least MinRSABits.
func Algorithm(pub crypto.PublicKey) (jose.SignatureAlgorithm, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return jose.ES256, nil
		case elliptic.P384():
			return jose.ES384, nil
		}
		return "", fmt.Errorf("%w: ECDSA curve %s (use P-256 or P-384)", ErrInvalidKey, k.Curve.Params().Name)
	case *rsa.PublicKey:
		if k.N.BitLen() < MinRSABits {
			return "", fmt.Errorf("%w: RSA key of %d bits (at least %d)", ErrInvalidKey, k.N.BitLen(), MinRSABits)
		}
		return jose.RS256, nil
	}
	return "", fmt.Errorf("%w: %T", ErrInvalidKey, pub)
}

// Mint signs c with key, naming it kid in the header (typ JWT). key may be
// any crypto.Signer of a type Algorithm accepts.
func Mint(key crypto.Signer, kid string, c Claims) (string, error) {
	if kid == "" {
		return "", fmt.Errorf("%w: kid is required", ErrInvalidKey)
	}
	if err := c.check(); err != nil {
		return "", err
	}
	alg, err := Algorithm(key.Public())
	if err != nil {
		return "", err
	}
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: alg, Key: cryptosigner.Opaque(key)},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid),
	)
	if err != nil {
		return "", fmt.Errorf("jwtsvid: %w", err)
	}
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{
		Issuer:   c.Issuer,
		Subject:  c.Subject.String(),
		Audience: jwt.Audience(c.Audience),
		IssuedAt: jwt.NewNumericDate(c.IssuedAt),
		Expiry:   jwt.NewNumericDate(c.Expiry),
	}).Serialize()
	if err != nil {
		return "", fmt.Errorf("jwtsvid: sign: %w", err)
	}
	return tok, nil
}

// Validate parses token and checks it against the JWT authorities of the
// subject's own trust domain in bundles, for one of audience (at least one
// is required: a token checked for no audience is accepted by anyone).
// Where issuer names the subject's trust domain's issuer, a token whose
// iss claim names another is refused (issuer may be nil).
func Validate(token string, bundles jwtbundle.Source, audience []string, issuer IssuerOf) (*spiffejwt.SVID, error) {
	switch {
	case len(audience) == 0:
		return nil, fmt.Errorf("%w: an audience to validate for is required", ErrInvalidToken)
	case len(token) > MaxTokenBytes:
		return nil, fmt.Errorf("%w: token of %d bytes is over the %d-byte limit", ErrInvalidToken, len(token), MaxTokenBytes)
	}
	for i, a := range audience {
		if a == "" {
			return nil, fmt.Errorf("%w: audience %d is empty", ErrInvalidToken, i+1)
		}
	}
	svid, err := spiffejwt.ParseAndValidate(token, bundles, audience)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if err := checkIssuer(svid, issuer); err != nil {
		return nil, err
	}
	return svid, nil
}
