package audit

import (
	"crypto/x509"
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Thresholds of the JWT authority findings. JWT-SVID validators take
// RS256 from 2048 bits (RFC 7518 §3.3) and EC from P-256.
const (
	MinJWTRSABits = 2048
	MinJWTECBits  = 256
)

// JWT finding codes.
const (
	CodeJWTWeakKey     = "jwt_weak_key"
	CodeJWTUnknownKey  = "jwt_unknown_key_type"
	CodeJWTNoActiveKey = "jwt_no_active_key"
	CodeJWTKeyExpired  = "jwt_key_expired"
	CodeJWTKeyExpiring = "jwt_key_expiring"
)

// jwtFindings judges td's JWT authorities and, for the local trust
// domain, the CA's own JWT keys.
func jwtFindings(td api.TrustDomain, now time.Time) []api.Finding {
	out := jwtKeyFindings(td, now)
	for _, a := range td.Authorities {
		if a.Kind == api.KindJWT {
			out = append(out, jwtAuthorityFindings(td, a)...)
		}
	}
	return out
}

// jwtAuthorityFindings judges one JWT authority's key: the key itself
// when the snapshot carries it, else what the server says of it. A key
// described by neither (a server that predates JWT details) is not
// judged. Publishing no JWT authority at all is no finding: a peer that
// issues no JWT-SVIDs needs none.
func jwtAuthorityFindings(td api.TrustDomain, a api.Authority) []api.Finding {
	name := fmt.Sprintf("JWT authority %q of %s", a.KeyID, td.Name)
	finding := func(sev api.Severity, code, msg, fix string) []api.Finding {
		return []api.Finding{{Severity: sev, Code: code, TrustDomain: td.Name, Authority: a.SHA256, Message: msg, Fix: fix}}
	}
	keyAlg, bits := a.PublicKeyAlgorithm, a.KeyBits
	if len(a.PublicKey) > 0 {
		pub, err := x509.ParsePKIXPublicKey(a.PublicKey)
		if err != nil {
			return finding(api.SeverityCritical, CodeUnparsableAuthor, fmt.Sprintf("%s is not a parsable public key: %v", name, err),
				"inspect the bundle (trustbridge bundle inspect) and remove the entry")
		}
		keyAlg, bits = api.PublicKeyAlgorithm(pub), api.KeyBits(pub)
	}
	replace := fmt.Sprintf("ask %s's operators to replace it with an EC P-256 (ES256) key and remove it from their bundle", td.Name)
	if td.Local {
		replace = "set the server's JWT key type to ES256 (the default) or ES384 and let the next JWT key rotation replace it"
	}
	switch keyAlg {
	case "":
		return nil
	case x509.RSA.String():
		if bits > 0 && bits < MinJWTRSABits {
			return finding(api.SeverityCritical, CodeJWTWeakKey,
				fmt.Sprintf("%s has a %d-bit RSA key (fewer than %d): JWT-SVIDs signed with a key this small can be forged", name, bits, MinJWTRSABits), replace)
		}
	case x509.ECDSA.String():
		if bits > 0 && bits < MinJWTECBits {
			return finding(api.SeverityCritical, CodeJWTWeakKey,
				fmt.Sprintf("%s has a %d-bit EC key (a curve below P-256)", name, bits), replace)
		}
	case x509.Ed25519.String():
	default:
		return finding(api.SeverityWarning, CodeJWTUnknownKey,
			fmt.Sprintf("%s has a key of unknown type %s: its strength cannot be judged and JWT-SVID validators may not use it", name, keyAlg), replace)
	}
	return nil
}

// jwtKeyFindings judges the local CA's own JWT signing keys: one must be
// active and within its life, and a successor must be prepared before
// the active one runs out. The CA prepares one at half the active key's
// life, so a quarter of its life left without one means rotation is
// stuck, an eighth that it is about to stop minting.
func jwtKeyFindings(td api.TrustDomain, now time.Time) []api.Finding {
	if !td.Local || !td.JWTIssuer {
		return nil
	}
	active, prepared := jwtKeysByState(td)
	var out []api.Finding
	if len(active) == 0 {
		out = append(out, noActiveJWTKeyFinding(td, prepared))
	}
	for _, a := range active {
		if f, ok := activeJWTKeyFinding(td, a, prepared, now); ok {
			out = append(out, f)
		}
	}
	return out
}

// checkJWTLeader is the common advice of the JWT key findings: only the
// leader creates and rotates JWT keys, so a stuck rotation is the
// leader's.
const checkJWTLeader = "check that the leader runs and what its log says about JWT key rotation; the leader creates and rotates JWT keys, followers only load them"

// jwtKeysByState is td's own JWT keys that are active, and whether one
// is prepared. X.509 authorities, and JWT ones without the CA's key
// details, count as neither.
func jwtKeysByState(td api.TrustDomain) (active []api.Authority, prepared bool) {
	for _, a := range td.Authorities {
		switch {
		case a.Kind != api.KindJWT || a.JWTKey == nil:
		case a.State == "active":
			active = append(active, a)
		case a.State == "prepared":
			prepared = true
		}
	}
	return active, prepared
}

// noActiveJWTKeyFinding is the finding of a CA with no active JWT key: a
// warning while a prepared key waits out its publication lead (an
// upgraded CA's first key does), critical otherwise.
func noActiveJWTKeyFinding(td api.TrustDomain, prepared bool) api.Finding {
	f := api.Finding{Code: CodeJWTNoActiveKey, TrustDomain: td.Name}
	if prepared {
		f.Severity = api.SeverityWarning
		f.Message = fmt.Sprintf("the CA of %s has no active JWT signing key yet: a prepared key signs once it has been published for 5 refresh hints (a CA upgraded to JWT-SVIDs publishes its first key that way); until then it cannot mint JWT-SVIDs", td.Name)
		f.Fix = "wait 5 refresh hints; if no key signs by then, " + checkJWTLeader
		return f
	}
	f.Severity = api.SeverityCritical
	f.Message = fmt.Sprintf("the CA of %s has no active JWT signing key: it cannot mint JWT-SVIDs", td.Name)
	f.Fix = checkJWTLeader
	return f
}

// activeJWTKeyFinding judges the life left on a, an active key of td:
// expired, or running out with no successor prepared. A key whose
// not_after is unknown is not judged; with a successor prepared, only
// expiry is, since the successor takes over in time.
func activeJWTKeyFinding(td api.TrustDomain, a api.Authority, prepared bool, now time.Time) (api.Finding, bool) {
	na := a.JWTKey.NotAfter
	if na == nil {
		return api.Finding{}, false
	}
	left := na.Sub(now)
	if left <= 0 {
		return api.Finding{Severity: api.SeverityCritical, Code: CodeJWTKeyExpired, TrustDomain: td.Name, Authority: a.SHA256,
			Message: fmt.Sprintf("the active JWT key %q of %s passed its not_after on %s: the CA refuses to sign with it, so JWT-SVID minting has stopped until a successor signs", a.KeyID, td.Name, na.UTC().Format(time.RFC3339)),
			Fix:     expiredKeyFix(prepared, checkJWTLeader)}, true
	}
	if prepared {
		return api.Finding{}, false
	}
	sev, ok := jwtExpirySeverity(a.JWTKey, left)
	if !ok {
		return api.Finding{}, false
	}
	return api.Finding{Severity: sev, Code: CodeJWTKeyExpiring, TrustDomain: td.Name, Authority: a.SHA256,
		Message: fmt.Sprintf("the active JWT key %q of %s expires in %s (%s) and no successor is prepared: a successor is published 5 refresh hints before it signs", a.KeyID, td.Name, durationLeft(left), na.UTC().Format(time.RFC3339)),
		Fix:     checkJWTLeader}, true
}

// expiredKeyFix says how minting resumes after the active key expired: a
// prepared successor activates after its lead; without one, a forced
// rotation publishes one, which signs after its lead too.
func expiredKeyFix(prepared bool, checkLeader string) string {
	if prepared {
		return "a successor is prepared and signs once it has been published for 5 refresh hints; if it does not, " + checkLeader
	}
	return "run `trustbridge ca rotate --jwt` against the leader's state: the new key signs once it has been published for 5 refresh hints; then " + checkLeader
}

// jwtExpirySeverity grades time left on an active key without a
// successor, by the key's life when known, else by the roots' thresholds.
func jwtExpirySeverity(k *api.JWTKey, left time.Duration) (api.Severity, bool) {
	warn, crit := ExpiryWarning, ExpiryCritical
	if k.CreatedAt != nil && k.NotAfter.After(*k.CreatedAt) {
		life := k.NotAfter.Sub(*k.CreatedAt)
		warn, crit = life/4, life/8
	}
	switch {
	case left <= crit:
		return api.SeverityCritical, true
	case left <= warn:
		return api.SeverityWarning, true
	}
	return "", false
}

// durationLeft is days when there are some, else hours or minutes.
func durationLeft(d time.Duration) string {
	if d >= 24*time.Hour {
		return days(d)
	}
	return d.Round(time.Minute).String()
}
