package audit

import (
	"crypto/x509"
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/internal/trustview"
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
func jwtFindings(td trustview.TrustDomain, now time.Time) []trustview.Finding {
	out := jwtKeyFindings(td, now)
	for _, a := range td.Authorities {
		if a.Kind == trustview.KindJWT {
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
func jwtAuthorityFindings(td trustview.TrustDomain, a trustview.Authority) []trustview.Finding {
	name := fmt.Sprintf("JWT authority %q of %s", a.KeyID, td.Name)
	finding := func(sev trustview.Severity, code, msg, fix string) []trustview.Finding {
		return []trustview.Finding{{Severity: sev, Code: code, TrustDomain: td.Name, Authority: a.SHA256, Message: msg, Fix: fix}}
	}
	keyAlg, bits := a.PublicKeyAlgorithm, a.KeyBits
	if len(a.PublicKey) > 0 {
		pub, err := x509.ParsePKIXPublicKey(a.PublicKey)
		if err != nil {
			return finding(trustview.SeverityCritical, CodeUnparsableAuthor, fmt.Sprintf("%s is not a parsable public key: %v", name, err),
				"inspect the bundle (trustbridge bundle inspect) and remove the entry")
		}
		keyAlg, bits = trustview.PublicKeyAlgorithm(pub), trustview.KeyBits(pub)
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
			return finding(trustview.SeverityCritical, CodeJWTWeakKey,
				fmt.Sprintf("%s has a %d-bit RSA key (fewer than %d): JWT-SVIDs signed with a key this small can be forged", name, bits, MinJWTRSABits), replace)
		}
	case x509.ECDSA.String():
		if bits > 0 && bits < MinJWTECBits {
			return finding(trustview.SeverityCritical, CodeJWTWeakKey,
				fmt.Sprintf("%s has a %d-bit EC key (a curve below P-256)", name, bits), replace)
		}
	case x509.Ed25519.String():
	default:
		return finding(trustview.SeverityWarning, CodeJWTUnknownKey,
			fmt.Sprintf("%s has a key of unknown type %s: its strength cannot be judged and JWT-SVID validators may not use it", name, keyAlg), replace)
	}
	return nil
}

// jwtKeyFindings judges the local CA's own JWT signing keys: one must be
// active and within its life, and a successor must be prepared before
// the active one runs out. The CA prepares one at half the active key's
// life, so a quarter of its life left without one means rotation is
// stuck, an eighth that it is about to stop minting.
func jwtKeyFindings(td trustview.TrustDomain, now time.Time) []trustview.Finding {
	if !td.Local || !td.JWTIssuer {
		return nil
	}
	var active []trustview.Authority
	prepared := false
	for _, a := range td.Authorities {
		switch {
		case a.Kind != trustview.KindJWT || a.JWTKey == nil:
		case a.State == "active":
			active = append(active, a)
		case a.State == "prepared":
			prepared = true
		}
	}
	var out []trustview.Finding
	add := func(sev trustview.Severity, code, authority, msg, fix string) {
		out = append(out, trustview.Finding{Severity: sev, Code: code, TrustDomain: td.Name, Authority: authority, Message: msg, Fix: fix})
	}
	const checkLeader = "check that the leader runs and what its log says about JWT key rotation; the leader creates and rotates JWT keys, followers only load them"
	switch {
	case len(active) == 0 && prepared:
		// An upgraded CA's first key waits out its publication lead.
		add(trustview.SeverityWarning, CodeJWTNoActiveKey, "",
			fmt.Sprintf("the CA of %s has no active JWT signing key yet: a prepared key signs once it has been published for 5 refresh hints (a CA upgraded to JWT-SVIDs publishes its first key that way); until then it cannot mint JWT-SVIDs", td.Name),
			"wait 5 refresh hints; if no key signs by then, "+checkLeader)
	case len(active) == 0:
		add(trustview.SeverityCritical, CodeJWTNoActiveKey, "",
			fmt.Sprintf("the CA of %s has no active JWT signing key: it cannot mint JWT-SVIDs", td.Name), checkLeader)
	}
	for _, a := range active {
		na := a.JWTKey.NotAfter
		if na == nil {
			continue
		}
		left := na.Sub(now)
		if left <= 0 {
			add(trustview.SeverityCritical, CodeJWTKeyExpired, a.SHA256,
				fmt.Sprintf("the active JWT key %q of %s passed its not_after on %s: the CA refuses to sign with it, so JWT-SVID minting has stopped until a successor signs", a.KeyID, td.Name, na.UTC().Format(time.RFC3339)),
				expiredKeyFix(prepared, checkLeader))
			continue
		}
		if prepared {
			continue
		}
		if sev, ok := jwtExpirySeverity(a.JWTKey, left); ok {
			add(sev, CodeJWTKeyExpiring, a.SHA256,
				fmt.Sprintf("the active JWT key %q of %s expires in %s (%s) and no successor is prepared: a successor is published 5 refresh hints before it signs", a.KeyID, td.Name, durationLeft(left), na.UTC().Format(time.RFC3339)),
				checkLeader)
		}
	}
	return out
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
func jwtExpirySeverity(k *trustview.JWTKey, left time.Duration) (trustview.Severity, bool) {
	warn, crit := ExpiryWarning, ExpiryCritical
	if k.CreatedAt != nil && k.NotAfter.After(*k.CreatedAt) {
		life := k.NotAfter.Sub(*k.CreatedAt)
		warn, crit = life/4, life/8
	}
	switch {
	case left <= crit:
		return trustview.SeverityCritical, true
	case left <= warn:
		return trustview.SeverityWarning, true
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
