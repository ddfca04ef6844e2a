package authn

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"time"
)

// jwtInfo is what is read from a JWT without verifying it: enough to tell a
// Kubernetes token from an opaque one, and to bound how long a review of it
// may be cached. Nothing here is trusted for authentication.
type jwtInfo struct {
	// exp is the expiry; zero when the token has no exp claim.
	exp time.Time
	// expInvalid is set when exp is present but unreadable; such a token's
	// review is never cached.
	expInvalid bool
}

// maxExpSeconds keeps exp within time.Time's comfortable range.
const maxExpSeconds = 1 << 40

// peekJWT parses a compact JWS without verifying it. It fails when the token
// does not have the shape of a JWT: three base64url parts whose header is a
// JSON object with a string "alg" and whose payload is a JSON object.
func peekJWT(token string) (jwtInfo, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return jwtInfo{}, errors.New("not a compact JWS")
	}
	var header struct {
		Alg *string `json:"alg"`
	}
	if err := decodeSegment(parts[0], &header); err != nil || header.Alg == nil {
		return jwtInfo{}, errors.New("JWT header is not a JSON object with alg")
	}
	var claims map[string]json.RawMessage
	if err := decodeSegment(parts[1], &claims); err != nil || claims == nil {
		return jwtInfo{}, errors.New("JWT payload is not a JSON object")
	}
	raw, ok := claims["exp"]
	if !ok {
		return jwtInfo{}, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return jwtInfo{expInvalid: true}, nil
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || f < 0 || f > maxExpSeconds {
		return jwtInfo{expInvalid: true}, nil
	}
	sec, frac := math.Modf(f)
	return jwtInfo{exp: time.Unix(int64(sec), int64(frac*1e9))}, nil
}

// decodeSegment decodes one base64url part (padding tolerated) as JSON.
func decodeSegment(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(seg, "="))
	if err != nil {
		return err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

// cacheUntil is when a successful review of a token with this info stops
// being reusable: ttl from now, but never past the token's expiry. The zero
// time means "do not cache".
func (j jwtInfo) cacheUntil(now time.Time, ttl time.Duration) time.Time {
	if j.expInvalid || ttl <= 0 {
		return time.Time{}
	}
	until := now.Add(ttl)
	if !j.exp.IsZero() && j.exp.Before(until) {
		until = j.exp
	}
	if !until.After(now) {
		return time.Time{}
	}
	return until
}
