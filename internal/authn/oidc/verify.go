package oidc

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// Results of trustbridge_authn_oidc_tokens_total.
const (
	resultAccepted         = "accepted"
	resultRefusedAlg       = "refused_alg"
	resultRefusedSignature = "refused_signature"
	resultRefusedKey       = "refused_unknown_key"
	resultRefusedTime      = "refused_time"
	resultRefusedAudience  = "refused_audience"
	resultRefusedClaims    = "refused_claims"
	resultRefusedRules     = "refused_rules"
	resultRefusedTemplate  = "refused_template"
	resultRefusedSubject   = "refused_subject"
	resultUnavailable      = "unavailable"
)

func allResults() []string {
	return []string{resultAccepted, resultRefusedAlg, resultRefusedSignature, resultRefusedKey, resultRefusedTime,
		resultRefusedAudience, resultRefusedClaims, resultRefusedRules, resultRefusedTemplate, resultRefusedSubject, resultUnavailable}
}

// refusal is a token refused: result is the metric label, kind the authn
// sentinel it wraps (ErrInvalidCredentials, ErrPermissionDenied,
// ErrUnavailable), err what was wrong (never token bytes).
type refusal struct {
	result string
	kind   error
	err    error
}

func refuse(result string, kind error, format string, args ...any) *refusal {
	return &refusal{result: result, kind: kind, err: fmt.Errorf(format, args...)}
}

func invalid(result, format string, args ...any) *refusal {
	return refuse(result, authn.ErrInvalidCredentials, format, args...)
}

// tokenHeader is the part of a JWS header read before any key work.
type tokenHeader struct {
	Alg  string
	Kid  string
	Crit bool // a "crit" member is present
}

// parseHeader reads alg, kid and crit by their exact names, as go-jose
// does: encoding/json's struct decoding would also take "ALG" or "Kid"
// and let the last of two win, so the header judged here could differ
// from the one go-jose verifies.
func parseHeader(seg string) (tokenHeader, error) {
	m, err := decodeExact(seg)
	if err != nil {
		return tokenHeader{}, err
	}
	var h tokenHeader
	if h.Alg, err = stringMember(m, "alg"); err != nil {
		return tokenHeader{}, err
	}
	if h.Kid, err = stringMember(m, "kid"); err != nil {
		return tokenHeader{}, err
	}
	_, h.Crit = m["crit"]
	return h, nil
}

// stringMember is m[name] as a string; "" when absent or null.
func stringMember(m map[string]json.RawMessage, name string) (string, error) {
	raw, ok := m[name]
	if !ok {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s is not a string", name)
	}
	return s, nil
}

// verified is a token whose signature and standard claims checked out.
type verified struct {
	claims map[string]any
	exp    time.Time
}

// verify checks token's signature against the issuer's keys and its
// standard claims at now. The algorithm is judged from the header before
// any key is fetched, so a token the issuer may not sign costs nothing.
func (is *issuer) verify(ctx context.Context, token string, now time.Time) (verified, *refusal) {
	h, r := is.checkHeader(token)
	if r != nil {
		return verified{}, r
	}
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(h.Alg)})
	if err != nil {
		return verified{}, invalid(resultRefusedClaims, "token is not a well-formed JWS")
	}
	keys, err := is.keys.Keys(ctx, h.Kid)
	switch {
	case errors.Is(err, ErrUnknownKey):
		return verified{}, invalid(resultRefusedKey, "token key id %q is not one of the issuer's keys: %v", truncate(h.Kid, 64), err)
	case err != nil:
		return verified{}, refuse(resultUnavailable, authn.ErrUnavailable, "issuer keys: %v", err)
	}
	payload, ok := verifySignature(jws, keys, h)
	if !ok {
		return verified{}, invalid(resultRefusedSignature, "token signature does not verify with the issuer's %d keys for key id %q", len(keys), truncate(h.Kid, 64))
	}
	claims, err := decodeObject(payload)
	if err != nil {
		return verified{}, invalid(resultRefusedClaims, "token claims: %v", err)
	}
	exp, r := is.checkClaims(claims, now)
	if r != nil {
		return verified{}, r
	}
	return verified{claims: claims, exp: exp}, nil
}

// checkHeader refuses an algorithm the issuer is not configured for (so
// never none or HMAC) and critical extensions, which nothing here
// understands (RFC 7515 §4.1.11).
func (is *issuer) checkHeader(token string) (tokenHeader, *refusal) {
	seg, _, _ := strings.Cut(token, ".")
	h, err := parseHeader(seg)
	if err != nil {
		return tokenHeader{}, invalid(resultRefusedClaims, "token header: %v", err)
	}
	if !slices.Contains(is.cfg.Algorithms, h.Alg) {
		return tokenHeader{}, invalid(resultRefusedAlg, "token algorithm %q is not one the issuer is configured for (%s)", truncate(h.Alg, 32), strings.Join(is.cfg.Algorithms, ", "))
	}
	if h.Crit {
		return tokenHeader{}, invalid(resultRefusedClaims, "token header has critical extensions, which are not supported")
	}
	return h, nil
}

// verifySignature tries each key meant for the token's algorithm; a key
// that names another algorithm is not used (RFC 7517 §4.4).
func verifySignature(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, h tokenHeader) ([]byte, bool) {
	for i := range keys {
		k := &keys[i]
		if (k.Algorithm != "" && k.Algorithm != h.Alg) || (h.Kid != "" && k.KeyID != h.Kid) || !k.IsPublic() {
			continue
		}
		if payload, err := jws.Verify(k); err == nil {
			return payload, true
		}
	}
	return nil, false
}

// checkClaims checks iss, exp, nbf, iat and aud (RFC 7519 §4.1) and
// returns exp.
func (is *issuer) checkClaims(claims map[string]any, now time.Time) (time.Time, *refusal) {
	if iss, _ := claims["iss"].(string); iss != is.cfg.Issuer {
		return time.Time{}, invalid(resultRefusedClaims, "token iss is not the issuer's")
	}
	exp, r := checkTimes(claims, now)
	if r != nil {
		return time.Time{}, r
	}
	return exp, is.checkAudience(claims["aud"])
}

// checkTimes applies authn.CheckTokenTimes, the rules local service
// account tokens get too, to the token's claims.
func checkTimes(claims map[string]any, now time.Time) (time.Time, *refusal) {
	exp, malformed, err := authn.CheckTokenTimes(func(name string) (any, bool) {
		v, ok := claims[name]
		return v, ok
	}, now)
	switch {
	case err == nil:
		return exp.UTC(), nil
	case malformed:
		return time.Time{}, &refusal{result: resultRefusedClaims, kind: authn.ErrInvalidCredentials, err: err}
	}
	return time.Time{}, &refusal{result: resultRefusedTime, kind: authn.ErrInvalidCredentials, err: err}
}

// checkAudience requires aud, one string or an array of strings, to hold
// one of the issuer's audiences.
func (is *issuer) checkAudience(aud any) *refusal {
	var auds []string
	switch v := aud.(type) {
	case string:
		auds = []string{v}
	case []any:
		for _, a := range v {
			s, ok := a.(string)
			if !ok {
				return invalid(resultRefusedClaims, "token aud holds %s, not only strings", jsonKind(a))
			}
			auds = append(auds, s)
		}
	default:
		return invalid(resultRefusedClaims, "token aud is %s, not a string or an array of strings", jsonKind(aud))
	}
	for _, a := range is.cfg.Audiences {
		if slices.Contains(auds, a) {
			return nil
		}
	}
	return invalid(resultRefusedAudience, "token is for none of the issuer's audiences")
}

// The claims of a service account token that must repeat its sub.
const (
	claimNamespace      = "kubernetes.io.namespace"
	claimServiceAccount = "kubernetes.io.serviceaccount.name"
)

// kubernetesID is the identity of a service account token: sub
// "system:serviceaccount:<ns>:<sa>", which the kubernetes.io claim must
// repeat, gives spiffe://<td>/ns/<ns>/sa/<sa>. The namespace must be a DNS
// label and the name a DNS subdomain, as the API server requires.
func kubernetesID(td spiffeid.TrustDomain, claims map[string]any) (spiffeid.ID, *refusal) {
	sub, _ := claims["sub"].(string)
	rest, ok := strings.CutPrefix(sub, "system:serviceaccount:")
	ns, sa, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || strings.Contains(sa, ":") {
		return spiffeid.ID{}, invalid(resultRefusedSubject, "token sub %q is not system:serviceaccount:<namespace>:<name>", truncate(sub, 128))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return spiffeid.ID{}, invalid(resultRefusedSubject, "token sub: namespace %q: %s", truncate(ns, 64), strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
		return spiffeid.ID{}, invalid(resultRefusedSubject, "token sub: service account name %q: %s", truncate(sa, 64), strings.Join(errs, "; "))
	}
	// The same dotted-path lookup as rules and templates, so a rule on
	// kubernetes.io.namespace judges the namespace the ID is made of.
	for _, c := range []struct{ path, want string }{{claimNamespace, ns}, {claimServiceAccount, sa}} {
		v, err := lookup(claims, c.path)
		if errors.Is(err, errClaimAmbiguous) {
			return spiffeid.ID{}, refuse(resultRefusedSubject, authn.ErrPermissionDenied, "token claim %q %v", c.path, err)
		}
		if s, _ := v.(string); err != nil || s != c.want {
			return spiffeid.ID{}, invalid(resultRefusedSubject, "token kubernetes.io claim does not name the subject's service account %s/%s", ns, sa)
		}
	}
	id, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	if err != nil {
		return spiffeid.ID{}, invalid(resultRefusedSubject, "service account %s/%s: %v", ns, sa, err)
	}
	return id, nil
}

// decodeExact decodes one base64url part of a compact JWS as a JSON
// object whose members are kept raw under their exact names. A name that
// appears twice is an error, as it is to go-jose, rather than the last
// one winning.
func decodeExact(seg string) (map[string]json.RawMessage, error) {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return nil, errors.New("not base64url")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	m := map[string]json.RawMessage{}
	for d.More() {
		tok, err := d.Token()
		name, isName := tok.(string)
		var raw json.RawMessage
		if err != nil || !isName || d.Decode(&raw) != nil {
			return nil, errors.New("not a JSON object")
		}
		if _, dup := m[name]; dup {
			return nil, errors.New("a member name appears twice")
		}
		m[name] = raw
	}
	if tok, err := d.Token(); err != nil || tok != json.Delim('}') {
		return nil, errors.New("not a JSON object")
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the JSON object")
	}
	return m, nil
}

// decodeObject decodes a JWT payload: one JSON object, numbers kept as
// their text.
func decodeObject(b []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil || m == nil {
		return nil, errors.New("payload is not a JSON object")
	}
	if d.More() {
		return nil, errors.New("data after the payload's JSON object")
	}
	return m, nil
}
