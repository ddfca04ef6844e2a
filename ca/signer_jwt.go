package ca

import (
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

// signJWTSVID is Authority.SignJWT.
func (s *signer) signJWTSVID(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
	token, exp, err := s.signJWT(id, audience, ttl)
	s.metrics.jwtSignings.WithLabelValues(jwtSignResult(err)).Inc()
	return token, exp, err
}

func (s *signer) signJWT(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
	switch {
	case id.IsZero() || id.TrustDomain() != s.cfg.TrustDomain:
		return "", time.Time{}, fmt.Errorf("ca: %w: %q is not in trust domain %s", ErrIdentityNotAllowed, id, s.cfg.TrustDomain)
	case ttl < 0:
		return "", time.Time{}, fmt.Errorf("ca: %w: JWT-SVID TTL %s is negative", ErrInvalidTTL, ttl)
	case ttl > 0 && ttl < time.Second:
		// Refused rather than rounded up: a caller asking for less than
		// the claims can say would get a token longer than it asked for.
		return "", time.Time{}, fmt.Errorf("ca: %w: JWT-SVID TTL %s is under one second, the resolution of JWT times; ask for at least 1s", ErrInvalidTTL, ttl)
	case len(audience) == 0:
		return "", time.Time{}, fmt.Errorf("ca: %w: at least one audience is required", jwtsvid.ErrInvalidClaims)
	case ttl == 0:
		ttl = s.cfg.JWTSVIDTTL
	}
	// The time board.read gives: a token is signed before or after a
	// retirement, never across it, so it never outlives the RemoveAfter
	// computed for its key.
	snap, now := s.board.read(s.cfg.Clock)
	ttl = min(ttl, snap.maxJWTSVIDTTL)
	k := snap.jwtKey
	if k == nil {
		return "", time.Time{}, snap.noJWTKey
	}
	if !now.Before(k.notAfter) {
		return "", time.Time{}, fmt.Errorf("ca: %w: active JWT key %s expired at %s and JWT-SVID minting has stopped; JWT key rotation is failing (see the CA's logs), or run `trustbridge ca rotate --jwt`",
			ErrInvalidSigningMaterial, k.kid, k.notAfter.UTC().Format(time.RFC3339))
	}
	// iat and exp are whole seconds in the token (NumericDate): truncate
	// both here, or a sub-second remainder could put exp at or before iat.
	// A ttl of at least 1s then always leaves exp after iat, unless the
	// key's NotAfter is within the second.
	iat := now.Truncate(time.Second)
	exp := minTime(iat.Add(ttl), k.notAfter).Truncate(time.Second)
	if !exp.After(iat) {
		return "", time.Time{}, fmt.Errorf("ca: %w: active JWT key %s expires at %s, less than a second from now; the leader activates its successor before then unless rotation is failing (see the CA's logs)",
			ErrInvalidSigningMaterial, k.kid, k.notAfter.UTC().Format(time.RFC3339))
	}
	token, err := jwtsvid.Mint(k.key, k.kid, jwtsvid.Claims{Issuer: s.cfg.JWTIssuer, Subject: id, Audience: audience, IssuedAt: iat, Expiry: exp})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("ca: %w", err)
	}
	return token, exp, nil
}

func jwtSignResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, jwtsvid.ErrInvalidClaims):
		return "invalid_claims"
	}
	if kind := SignErrorKind(err); kind != "" {
		return kind
	}
	return "error"
}
