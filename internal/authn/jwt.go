package authn

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
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
	// iss is the issuer claim when it is a string, "" otherwise: it routes
	// the token to the authenticator of its issuer, nothing more.
	iss string
}

// maxExpSeconds keeps exp within time.Time's comfortable range.
const maxExpSeconds = 1 << 40

// peekJWT parses a compact JWS without verifying it. It fails when the token
// does not have the shape of a JWT: three base64url parts whose header is a
// JSON object with a string "alg" and whose payload is a JSON object.
func peekJWT(token string) (jwtInfo, error) {
	claims, err := peekClaims(token)
	if err != nil {
		return jwtInfo{}, err
	}
	var info jwtInfo
	if raw, ok := claims["iss"]; ok {
		_ = json.Unmarshal(raw, &info.iss) // not a string: no issuer to route by
	}
	if raw, ok := claims["exp"]; ok {
		info.exp, info.expInvalid = readExp(raw)
	}
	return info, nil
}

// peekClaims checks the shape of a compact JWS (three non-empty parts, a
// header that is a JSON object with "alg") and returns its payload's claims,
// unverified.
func peekClaims(token string) (map[string]json.RawMessage, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return nil, errors.New("not a compact JWS")
	}
	var header struct {
		Alg *string `json:"alg"`
	}
	if err := decodeSegment(parts[0], &header); err != nil || header.Alg == nil {
		return nil, errors.New("JWT header is not a JSON object with alg")
	}
	var claims map[string]json.RawMessage
	if err := decodeSegment(parts[1], &claims); err != nil || claims == nil {
		return nil, errors.New("JWT payload is not a JSON object")
	}
	return claims, nil
}

// readExp reads an exp claim as seconds since the epoch, fractions allowed.
// invalid is set, and exp zero, when it is not a number in [0,
// maxExpSeconds].
func readExp(raw json.RawMessage) (exp time.Time, invalid bool) {
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return time.Time{}, true
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || f < 0 || f > maxExpSeconds {
		return time.Time{}, true
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), false
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

// Local checks of a service account token, made before a TokenReview is
// spent on it. They are necessary conditions only: a token that passes is
// still reviewed, since only the API server knows whether its service
// account, pod or secret still exists.
const (
	// clockLeeway tolerates clocks of the API server and this server that
	// disagree a little, for nbf and iat.
	clockLeeway = time.Minute
	// maxTokenAhead bounds exp: kube-apiserver extends projected tokens to
	// at most a year (--service-account-extend-token-expiration), so a
	// later exp is not one it wrote.
	maxTokenAhead = 366 * 24 * time.Hour
)

// tokenAlgs are the JWS algorithms kube-apiserver signs service account
// tokens with (RSA and ECDSA keys), and the RSA-PSS family a custom
// signer may use. Never "none", never HMAC: a shared secret would mean
// anyone who can verify can also forge.
var tokenAlgs = []string{"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"}

// Reasons a token is refused locally, labels of
// trustbridge_authn_token_local_checks_total.
const (
	localRefusedAlg       = "refused_alg"
	localRefusedClaims    = "refused_claims"
	localRefusedTime      = "refused_time"
	localRefusedAudience  = "refused_audience"
	localRefusedSubject   = "refused_subject"
	localRefusedKey       = "refused_unknown_key"
	localRefusedSignature = "refused_signature"
	localRefusedCluster   = "refused_cluster" // ClusterID metadata names a cluster not reviewed here
	localVerified         = "verified"        // the signature checked against the issuer's keys
	localUnverified       = "unverified"      // claims checked, no issuer keys to check the signature
)

// jwtHeader is the part of a JWS header read locally.
type jwtHeader struct {
	Alg  string   `json:"alg"`
	Kid  string   `json:"kid"`
	Crit []string `json:"crit"`
}

// saClaims are the claims kube-apiserver writes into a service account
// token. Unknown claims are ignored.
type saClaims struct {
	Iss  string        `json:"iss"`
	Sub  string        `json:"sub"`
	Aud  audiences     `json:"aud"`
	Exp  *json.Number  `json:"exp"`
	Nbf  *json.Number  `json:"nbf"`
	Iat  *json.Number  `json:"iat"`
	Kube *kubeioClaims `json:"kubernetes.io"`
}

// kubeioClaims is the "kubernetes.io" claim of a service account token.
type kubeioClaims struct {
	Namespace      string     `json:"namespace"`
	ServiceAccount *kubeioRef `json:"serviceaccount"`
	Pod            *kubeioRef `json:"pod"`
	Secret         *kubeioRef `json:"secret"`
	Node           *kubeioRef `json:"node"`
}

type kubeioRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// audiences reads "aud" as RFC 7519 allows: one string or an array.
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud is neither a string nor an array of strings")
	}
	*a = many
	return nil
}

// localToken is a token that passed the local claim checks: what the
// signature check and the review need.
type localToken struct {
	alg, kid string
	ns, sa   string
	iat      time.Time // zero when the token has none
	exp      time.Time // always set: checkTokenTimes requires it
}

// localRefusal is a token refused without a TokenReview: reason is the
// metric label, err says what was wrong (never with token bytes).
type localRefusal struct {
	reason string
	err    error
}

func (r *localRefusal) Error() string { return r.err.Error() }
func (r *localRefusal) Unwrap() error { return r.err }

func refuseLocal(reason, format string, args ...any) *localRefusal {
	return &localRefusal{reason: reason, err: fmt.Errorf(format, args...)}
}

// checkTokenClaims checks what a service account token for audience must
// say at now. token has passed peekJWT.
func checkTokenClaims(token, audience string, now time.Time) (localToken, *localRefusal) {
	parts := strings.SplitN(token, ".", 3)
	var h jwtHeader
	if err := decodeSegment(parts[0], &h); err != nil {
		return localToken{}, refuseLocal(localRefusedClaims, "JWT header: %v", err)
	}
	if !slices.Contains(tokenAlgs, h.Alg) {
		return localToken{}, refuseLocal(localRefusedAlg, "JWT algorithm %q is not one service account tokens are signed with", truncate(h.Alg, 32))
	}
	if len(h.Crit) > 0 {
		return localToken{}, refuseLocal(localRefusedClaims, "JWT header has critical extensions")
	}
	var c saClaims
	if err := decodeSegment(parts[1], &c); err != nil {
		return localToken{}, refuseLocal(localRefusedClaims, "JWT claims: %v", err)
	}
	if c.Iss == "" {
		return localToken{}, refuseLocal(localRefusedClaims, "token has no issuer")
	}
	exp, r := checkTokenTimes(c, now)
	if r != nil {
		return localToken{}, r
	}
	if !slices.Contains(c.Aud, audience) {
		return localToken{}, refuseLocal(localRefusedAudience, "token is not for audience %q", audience)
	}
	ns, sa, err := parseServiceAccountUsername(c.Sub)
	if err != nil {
		return localToken{}, refuseLocal(localRefusedSubject, "token subject: %v", err)
	}
	if k := c.Kube; k != nil {
		if k.Namespace != ns || k.ServiceAccount == nil || k.ServiceAccount.Name != sa {
			return localToken{}, refuseLocal(localRefusedSubject, "kubernetes.io claim does not name the subject's service account %s/%s", ns, sa)
		}
	}
	iat, _ := numericDate(c.Iat)
	return localToken{alg: h.Alg, kid: h.Kid, ns: ns, sa: sa, iat: iat, exp: exp}, nil
}

// checkTokenTimes applies CheckTokenTimes to a service account token's
// claims; a null or absent claim is absent.
func checkTokenTimes(c saClaims, now time.Time) (time.Time, *localRefusal) {
	byName := map[string]*json.Number{"exp": c.Exp, "nbf": c.Nbf, "iat": c.Iat}
	exp, malformed, err := CheckTokenTimes(func(name string) (any, bool) {
		if n := byName[name]; n != nil {
			return *n, true
		}
		return nil, false
	}, now)
	switch {
	case err == nil:
		return exp, nil
	case malformed:
		return time.Time{}, &localRefusal{reason: localRefusedClaims, err: err}
	}
	return time.Time{}, &localRefusal{reason: localRefusedTime, err: err}
}

// CheckTokenTimes checks a JWT's exp, nbf and iat (RFC 7519 §4.1.4–6) at
// now, each read through claim (its decoded value, a json.Number for a
// number, and whether it is present): exp is required, in the future and
// at most a year and a day away (kube-apiserver extends projected tokens
// to at most a year, and no issuer means more); nbf and iat, when present,
// are not later than now plus a minute of clock leeway. It returns exp.
// malformed says the refusal is about a value that is no NumericDate (a
// claims problem) rather than about time. Errors never hold token bytes.
func CheckTokenTimes(claim func(name string) (v any, present bool), now time.Time) (exp time.Time, malformed bool, err error) {
	raw, present := claim("exp")
	exp, ok := numericDateOf(raw)
	switch {
	case !present:
		return time.Time{}, false, errors.New("token has no exp")
	case !ok:
		return time.Time{}, true, errors.New("token exp is not a date")
	case !now.Before(exp):
		return time.Time{}, false, fmt.Errorf("token expired at %s", exp.UTC().Format(time.RFC3339))
	case exp.Sub(now) > maxTokenAhead:
		return time.Time{}, false, fmt.Errorf("token exp %s is more than %s away", exp.UTC().Format(time.RFC3339), maxTokenAhead)
	}
	for _, name := range []string{"nbf", "iat"} {
		raw, present := claim(name)
		if !present {
			continue
		}
		t, ok := numericDateOf(raw)
		if !ok {
			return time.Time{}, true, fmt.Errorf("token %s is not a date", name)
		}
		if t.After(now.Add(clockLeeway)) {
			return time.Time{}, false, fmt.Errorf("token %s %s is in the future", name, t.UTC().Format(time.RFC3339))
		}
	}
	return exp, false, nil
}

// numericDateOf is numericDate of a decoded claim value: a json.Number,
// anything else is no date.
func numericDateOf(v any) (time.Time, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return time.Time{}, false
	}
	return numericDate(&n)
}

// numericDate reads an RFC 7519 NumericDate within [0, maxExpSeconds].
func numericDate(n *json.Number) (time.Time, bool) {
	if n == nil {
		return time.Time{}, false
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || f < 0 || f > maxExpSeconds {
		return time.Time{}, false
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), true
}
