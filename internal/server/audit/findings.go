package audit

import (
	"cmp"
	"crypto/x509"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Thresholds of the findings.
const (
	ExpiryWarning  = 30 * 24 * time.Hour
	ExpiryCritical = 7 * 24 * time.Hour
	MinRSABits     = 3072
)

// Finding codes.
const (
	CodeExpired          = "authority_expired"
	CodeExpiring         = "authority_expiring"
	CodeWeakKey          = "weak_key"
	CodeWeakSignature    = "weak_signature"
	CodeNotCA            = "not_ca"
	CodeStale            = "federation_stale"
	CodeNeverFetched     = "federation_never_fetched"
	CodeSequenceRegress  = "sequence_regression"
	CodeRevokedReturned  = "revoked_authority_returned"
	CodeSharedRoot       = "root_shared_across_trust_domains"
	CodeNotHTTPS         = "endpoint_not_https"
	CodeProfileFallback  = "profile_fallback"
	CodeUnparsableAuthor = "authority_unparsable"
	CodeNoTrustPolicy    = "no_trust_policy"
	CodePolicyConflict   = "trust_policy_conflict"
	CodePolicyUnfederate = "trust_policy_grants_unfederated"
	CodePolicyRejected   = "trust_policy_source_rejected"
)

// Findings judges s with the default Options. They are sorted critical
// first, then by trust domain and code.
func Findings(s api.Snapshot) []api.Finding {
	return FindingsWith(s, Options{})
}

// FindingsWith is Findings with o's thresholds (CheckOptions first).
func FindingsWith(s api.Snapshot, o Options) []api.Finding {
	o = o.withDefaults()
	now := s.Time
	if now.IsZero() {
		now = time.Now()
	}
	out := noIntermediate(s, now)
	holders := map[string][]string{} // x509 sha256 -> trust domains
	for _, td := range s.TrustDomains {
		rotate := rotateAdvice(td)
		out = append(out, jwtFindings(td, now)...)
		out = append(out, hsmFindings(s, td)...)
		out = append(out, upstreamFindings(s, td, now, o)...)
		out = append(out, taintFindings(td)...)
		for _, a := range td.Authorities {
			// A revoked root is no longer trusted: nothing to judge.
			if a.Kind != api.KindX509 || isIntermediate(td, a) || a.State == stateRevoked {
				continue
			}
			if !slices.Contains(holders[a.SHA256], td.Name) {
				holders[a.SHA256] = append(holders[a.SHA256], td.Name)
			}
			out = append(out, authorityFindings(td, a, now, rotate)...)
		}
		if f := td.Federation; f != nil {
			out = append(out, federationFindings(td.Name, f)...)
			out = append(out, neverFetchedFindings(td, f)...)
		}
	}
	out = append(out, policyFindings(s)...)
	out = append(out, identityMapFindings(s)...)
	out = append(out, oidcFindings(s)...)
	out = append(out, clusterTrustBundleFindings(s)...)
	out = append(out, sharedRootFindings(holders)...)
	sortFindings(out)
	return out
}

// rotateAdvice is the fix offered for an expiring root of td: the local
// CA can rotate now, a peer's operators must publish a successor.
func rotateAdvice(td api.TrustDomain) string {
	if td.Local {
		return "rotate now: trustbridge ca rotate (the successor is published at once and signs after 5 refresh hints)"
	}
	return fmt.Sprintf("ask %s's operators to publish a successor root and move to it", td.Name)
}

// federationFindings judges the federation relationship f with the trust
// domain named td: staleness, refused bundles, and a bundle endpoint that
// is not https.
func federationFindings(td string, f *api.Federation) []api.Finding {
	var out []api.Finding
	add := func(sev api.Severity, code, msg, fix string) {
		out = append(out, api.Finding{Severity: sev, Code: code, TrustDomain: td, Message: msg, Fix: fix})
	}
	if f.State == "stale" {
		since := "never fetched"
		if f.LastSuccess != nil {
			since = "last success " + f.LastSuccess.UTC().Format(time.RFC3339)
		}
		add(api.SeverityWarning, CodeStale,
			fmt.Sprintf("federation with %s is stale (%s); its last good bundle is still trusted: %s", td, since, f.LastError),
			fmt.Sprintf("check that %s is reachable and serves a valid bundle (trustbridge federation status); remove the relationship if it is no longer needed", f.EndpointURL))
	}
	if n := f.Refusals["sequence_regression"]; n > 0 {
		add(api.SeverityCritical, CodeSequenceRegress,
			fmt.Sprintf("%s served a bundle with a lower spiffe_sequence than one already trusted (%d times since start): a rollback or a replayed bundle", td, n),
			fmt.Sprintf("confirm with %s's operators whether their bundle was rolled back; trustbridge kept the newer bundle and refuses the older one", td))
	}
	if n := f.Refusals["revoked_authority"]; n > 0 {
		add(api.SeverityCritical, CodeRevokedReturned,
			fmt.Sprintf("%s served a bundle carrying an authority it revoked (%d times since start): its state looks restored from before the revocation, or the bundle lists and carries the same authority", td, n),
			fmt.Sprintf("ask %s's operators to revoke the authority again (trustbridge keeps the last good bundle and refuses these); the status's last error names it", td))
	}
	if n := f.Refusals["profile_mismatch"]; n > 0 {
		add(api.SeverityCritical, CodeProfileFallback,
			fmt.Sprintf("%s presented the other federation profile's certificate on its %s endpoint (%d times since start); a client that fell back would have trusted it", td, f.Profile, n),
			"verify the endpoint's certificate and the configured profile and endpoint SPIFFE ID with the peer; never switch profiles to make it pass")
	}
	if u, err := url.Parse(f.EndpointURL); err != nil || u.Scheme != "https" {
		add(api.SeverityCritical, CodeNotHTTPS,
			fmt.Sprintf("%s's bundle endpoint %q is not an https URL", td, f.EndpointURL),
			"use the peer's https bundle endpoint URL; bundles fetched without TLS can be replaced in transit")
	}
	return out
}

// neverFetchedFindings reports a federated trust domain whose endpoint was
// polled, never served a bundle, and is failing for it (the poller's
// "never answered" rule, federation.stateOf): nothing of td is trusted,
// so none of its workloads can be authenticated. A peer with a bootstrap
// bundle held goes stale instead (a warning: that bundle is trusted).
func neverFetchedFindings(td api.TrustDomain, f *api.Federation) []api.Finding {
	if f.State != "failing" || f.LastAttempt == nil || f.LastSuccess != nil || len(td.Authorities) > 0 {
		return nil
	}
	return []api.Finding{{Severity: api.SeverityCritical, Code: CodeNeverFetched, TrustDomain: td.Name,
		Message: fmt.Sprintf("%s's bundle endpoint %s has never served a bundle (%d failed polls): nothing of %s is trusted, its workloads cannot be authenticated: %s",
			td.Name, f.EndpointURL, f.ConsecutiveFailures, td.Name, f.LastError),
		Fix: fmt.Sprintf("check that %s is reachable from this server and serves %s's bundle (trustbridge federation status shows the last error); remove the relationship if it is not needed (trustbridge federation remove %s)",
			f.EndpointURL, td.Name, td.Name)}}
}

// sharedRootFindings reports each root trusted for more than one trust
// domain; holders maps a root's sha256 to the trust domains holding it.
func sharedRootFindings(holders map[string][]string) []api.Finding {
	var out []api.Finding
	for sha, tds := range holders {
		if len(tds) > 1 {
			slices.Sort(tds)
			out = append(out, api.Finding{Severity: api.SeverityCritical, Code: CodeSharedRoot, TrustDomain: strings.Join(tds, ","), Authority: sha,
				Message: fmt.Sprintf("the same root (sha256 %s) is trusted for %s: its key can mint identities in each of them", ShortHash(sha), strings.Join(tds, " and ")),
				Fix:     "every trust domain needs its own root; find out which trust domain owns this root and remove it from the others' bundles"})
		}
	}
	return out
}

// sortFindings orders findings critical first, then by trust domain, code
// and authority.
func sortFindings(out []api.Finding) {
	slices.SortFunc(out, func(a, b api.Finding) int {
		if a.Severity != b.Severity {
			if a.Severity == api.SeverityCritical {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.TrustDomain, b.TrustDomain), cmp.Compare(a.Code, b.Code), cmp.Compare(a.Authority, b.Authority))
	})
}

// authorityFindings judges one X.509 root a of td: expiry, key size,
// signature algorithm and CA-ness. rotate is the fix for an expiring root.
func authorityFindings(td api.TrustDomain, a api.Authority, now time.Time, rotate string) []api.Finding {
	name := a.Subject
	if name == "" {
		name = ShortHash(a.SHA256)
	}
	r := authorityReport{td: td.Name, sha: a.SHA256}
	f, err := authorityFactsOf(a)
	if err != nil {
		r.add(api.SeverityCritical, CodeUnparsableAuthor, fmt.Sprintf("authority %q of %s is not a parsable certificate: %v", name, td.Name, err),
			"inspect the bundle (trustbridge bundle inspect) and remove the entry")
		return r.out
	}
	if f.notAfter != nil {
		r.expiry(name, *f.notAfter, a.State, now, rotate)
	}
	if f.keyAlg == "RSA" && f.bits > 0 && f.bits < MinRSABits {
		r.add(api.SeverityWarning, CodeWeakKey,
			fmt.Sprintf("authority %q of %s has a %d-bit RSA key (fewer than %d)", name, td.Name, f.bits, MinRSABits),
			"move to RSA 3072+ or ECDSA P-256 at the next rotation (trustbridge server --ca-key-type)")
	}
	if strings.Contains(strings.ToUpper(f.sigAlg), "SHA1") {
		r.add(api.SeverityWarning, CodeWeakSignature,
			fmt.Sprintf("authority %q of %s is signed with %s", name, td.Name, f.sigAlg),
			"re-issue the root with a SHA-256 (or stronger) signature")
	}
	if !f.isCA {
		r.add(api.SeverityCritical, CodeNotCA,
			fmt.Sprintf("authority %q in %s's bundle is not a CA certificate", name, td.Name),
			"a bundle holds CA certificates only (X509-SVID §6); remove this entry: a leaf placed in a trust bundle is trusted as an anchor")
	}
	return r.out
}

// authorityFacts are what authorityFindings judges of an authority.
type authorityFacts struct {
	notAfter       *time.Time
	isCA           bool
	sigAlg, keyAlg string
	bits           int
}

// authorityFactsOf reads the facts from a's certificate when it carries
// one, so the certificate itself is judged, not what the server says of
// it; else it takes them as reported. An unparsable certificate is an
// error.
func authorityFactsOf(a api.Authority) (authorityFacts, error) {
	f := authorityFacts{notAfter: a.NotAfter, isCA: a.IsCA, sigAlg: a.SignatureAlgorithm, keyAlg: a.PublicKeyAlgorithm, bits: a.KeyBits}
	if len(a.Certificate) == 0 {
		return f, nil
	}
	c, err := x509.ParseCertificate(a.Certificate)
	if err != nil {
		return f, err
	}
	na := c.NotAfter
	f.notAfter, f.isCA = &na, c.BasicConstraintsValid && c.IsCA
	f.sigAlg, f.keyAlg, f.bits = c.SignatureAlgorithm.String(), c.PublicKeyAlgorithm.String(), api.KeyBits(c.PublicKey)
	if c.SignatureAlgorithm == x509.SHA1WithRSA || c.SignatureAlgorithm == x509.ECDSAWithSHA1 || c.SignatureAlgorithm == x509.DSAWithSHA1 {
		f.sigAlg = "SHA1-" + f.keyAlg
	}
	return f, nil
}

// authorityReport collects the findings about one authority of a trust
// domain.
type authorityReport struct {
	td, sha string
	out     []api.Finding
}

func (r *authorityReport) add(sev api.Severity, code, msg, fix string) {
	r.out = append(r.out, api.Finding{Severity: sev, Code: code, TrustDomain: r.td, Authority: r.sha, Message: msg, Fix: fix})
}

// expiry reports an authority named name that has expired or expires
// soon; a retired root close to its end is only worth a finding once it
// is critical.
func (r *authorityReport) expiry(name string, notAfter time.Time, state string, now time.Time, rotate string) {
	left := notAfter.Sub(now)
	switch {
	case left <= 0:
		r.add(api.SeverityCritical, CodeExpired,
			fmt.Sprintf("authority %q of %s expired on %s", name, r.td, notAfter.UTC().Format(time.DateOnly)),
			"remove it from the bundle; certificates it signed no longer verify. "+rotate)
	case left <= ExpiryCritical:
		r.add(api.SeverityCritical, CodeExpiring,
			fmt.Sprintf("authority %q of %s expires in %s (%s)", name, r.td, days(left), notAfter.UTC().Format(time.DateOnly)),
			rotate)
	case left <= ExpiryWarning && state != "retired":
		r.add(api.SeverityWarning, CodeExpiring,
			fmt.Sprintf("authority %q of %s expires in %s (%s)", name, r.td, days(left), notAfter.UTC().Format(time.DateOnly)),
			rotate)
	}
}

func days(d time.Duration) string {
	n := int(d.Hours() / 24)
	switch {
	case n < 1:
		return "less than a day"
	case n == 1:
		return "1 day"
	}
	return fmt.Sprintf("%d days", n)
}

// AtLeast reports whether any finding is at sev or above.
func AtLeast(fs []api.Finding, sev api.Severity) bool {
	for _, f := range fs {
		if f.Severity == api.SeverityCritical || f.Severity == sev {
			return true
		}
	}
	return false
}
