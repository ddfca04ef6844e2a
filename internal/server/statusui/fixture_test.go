package statusui

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// fixtureNow is the instant every fixture is taken at, so pages and the
// screenshot are the same on every run.
var fixtureNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func at(s string) *time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return &t
}

func ago(d time.Duration) *time.Time {
	t := fixtureNow.Add(-d)
	return &t
}

func u64(v uint64) *uint64 { return &v }

func fp(seed string) string {
	sum := sha256.Sum256([]byte(seed))
	return hex.EncodeToString(sum[:])
}

func root(subject, from, until string) api.Authority {
	return api.Authority{
		Kind: api.KindX509, SHA256: fp(subject + from), Subject: subject,
		NotBefore: at(from), NotAfter: at(until), IsCA: true,
		SignatureAlgorithm: "ECDSA-SHA256", PublicKeyAlgorithm: "ECDSA", KeyBits: 256,
	}
}

func localRoot(state, subject, from, until string, since *time.Time) api.Authority {
	a := root(subject, from, until)
	a.State, a.Since = state, since
	return a
}

func jwtKey(kid string) api.Authority {
	return api.Authority{Kind: api.KindJWT, SHA256: fp(kid), KeyID: kid}
}

// realisticSnapshot is a server in prod.acme.example with its CA's roots
// in all three states, three federated trust domains (ok, failing,
// stale), one trust domain from a bundle file, and findings.
func realisticSnapshot() (api.Snapshot, []api.Finding) {
	legacy := root("CN=legacy.acme.example root,O=ACME Corp", "2024-01-10T00:00:00Z", "2029-01-10T00:00:00Z")
	legacy.SignatureAlgorithm, legacy.PublicKeyAlgorithm, legacy.KeyBits = "SHA256-RSA", "RSA", 2048
	corp := root("CN=ACME Corporate Root CA G2,OU=PKI,O=ACME Corp,C=US", "2021-03-01T00:00:00Z", "2031-03-01T00:00:00Z")
	corp.SignatureAlgorithm, corp.PublicKeyAlgorithm, corp.KeyBits = "SHA384-RSA", "RSA", 4096
	vendor := root("CN=analytics.vendor.example SPIFFE root,O=Vendor Inc", "2025-11-27T09:30:00Z", "2026-11-27T09:30:00Z")
	retired := localRoot("retired", "CN=prod.acme.example root 2025-12,O=ACME Corp", "2025-12-01T08:00:00Z", "2026-12-01T08:00:00Z", at("2026-06-02T08:00:00Z"))
	active := localRoot("active", "CN=prod.acme.example root 2026-06,O=ACME Corp", "2026-05-25T08:00:00Z", "2027-05-25T08:00:00Z", at("2026-06-02T08:00:00Z"))
	prepared := localRoot("prepared", "CN=prod.acme.example root 2026-11,O=ACME Corp", "2026-11-15T08:00:00Z", "2027-11-15T08:00:00Z", at("2026-11-15T08:00:00Z"))
	s := api.Snapshot{
		Time: fixtureNow, TrustDomain: "prod.acme.example", Actor: "trustbridge-7d9f8c6b5-x2k4q", Leader: true,
		TrustDomains: []api.TrustDomain{
			{
				Name: "prod.acme.example", Local: true, Sources: []string{"ca"}, Sequence: u64(42),
				Authorities: []api.Authority{retired, active, prepared, jwtKey("c2b3Xq9LmT")},
			},
			{
				Name: "analytics.vendor.example", Sources: []string{"federation:analytics.vendor.example"}, Sequence: u64(17),
				Federation: &api.Federation{
					EndpointURL: "https://bundles.vendor.example/analytics", Profile: "https_web", Origin: "flag",
					State: "failing", LastAttempt: ago(2 * time.Minute), LastSuccess: ago(3*time.Hour + 12*time.Minute),
					NextRefresh: at("2026-11-22T12:04:00Z"), ConsecutiveFailures: 4,
					LastError: "tls: failed to verify certificate: x509: certificate signed by unknown authority",
					Refusals:  map[string]uint64{"tls": 4, "timeout": 1},
				},
				Authorities: []api.Authority{vendor},
			},
			{
				Name: "corp-root.acme.example", Sources: []string{"file:/etc/trustbridge/bundles/corp-root.json"},
				Authorities: []api.Authority{corp},
			},
			{
				Name: "legacy.acme.example", Sources: []string{"federation:legacy.acme.example"}, Sequence: u64(3),
				Federation: &api.Federation{
					EndpointURL: "https://spire.legacy.acme.example:8443", Profile: "https_spiffe",
					EndpointSPIFFEID: "spiffe://legacy.acme.example/spire/server", Origin: "file",
					State: "stale", LastAttempt: ago(time.Minute), LastSuccess: ago(26 * time.Hour),
					NextRefresh: at("2026-11-22T12:05:00Z"), ConsecutiveFailures: 31,
					LastError: "fetch: Get \"https://spire.legacy.acme.example:8443\": dial tcp 10.20.0.7:8443: i/o timeout",
					Refusals:  map[string]uint64{"timeout": 31},
				},
				Authorities: []api.Authority{legacy},
			},
			{
				Name: "partner-bank.example", Sources: []string{"federation:partner-bank.example"}, Sequence: u64(1289),
				Federation: &api.Federation{
					EndpointURL: "https://trust.partner-bank.example/bundle", Profile: "https_spiffe",
					EndpointSPIFFEID: "spiffe://partner-bank.example/trustbridge", Origin: "crd:partner-bank",
					State: "ok", LastAttempt: ago(4 * time.Minute), LastSuccess: ago(4 * time.Minute),
					NextRefresh: at("2026-11-22T12:26:00Z"),
				},
				Authorities: []api.Authority{
					root("CN=partner-bank.example root A,O=Partner Bank", "2026-03-01T00:00:00Z", "2027-03-01T00:00:00Z"),
					root("CN=partner-bank.example root B,O=Partner Bank", "2026-09-01T00:00:00Z", "2027-09-01T00:00:00Z"),
					jwtKey("pb-2026-09"),
				},
			},
		},
	}
	addPolicy(&s)
	findings := []api.Finding{
		{Severity: api.SeverityWarning, Code: "authority_expiring", TrustDomain: "prod.acme.example", Authority: retired.SHA256,
			Message: "retired root \"prod.acme.example root 2025-12\" expires in 9 days (2026-12-01)",
			Fix:     "nothing issued under it should still be valid; remove it after expiry with `trustbridge ca roots remove`"},
		{Severity: api.SeverityCritical, Code: "authority_expiring", TrustDomain: "analytics.vendor.example", Authority: vendor.SHA256,
			Message: "authority \"analytics.vendor.example SPIFFE root\" expires in 4 days (2026-11-27) and the endpoint is failing",
			Fix:     "ask analytics.vendor.example to publish its next root, and fix the endpoint's TLS so the new bundle can be fetched"},
		{Severity: api.SeverityWarning, Code: "federation_stale", TrustDomain: "legacy.acme.example",
			Message: "no successful poll of legacy.acme.example for 26h; its last good bundle is still trusted",
			Fix:     "check reachability of https://spire.legacy.acme.example:8443, or remove the relationship if it is no longer needed"},
		{Severity: api.SeverityWarning, Code: "weak_key", TrustDomain: "legacy.acme.example", Authority: legacy.SHA256,
			Message: "authority \"legacy.acme.example root\" has a 2048-bit RSA key",
			Fix:     "rotate to RSA 3072+ or ECDSA P-256 at the next root rotation"},
		{Severity: api.SeverityCritical, Code: "profile_fallback", TrustDomain: "analytics.vendor.example",
			Message: "the https_web endpoint presented an X509-SVID without a DNS SAN for bundles.vendor.example",
			Fix:     "serve a Web PKI certificate for the host, or configure the endpoint as https_spiffe with its SPIFFE ID"},
	}
	return s, findings
}

// addPolicy gives the realistic snapshot a trust policy: payments may
// trust partner-bank.example's billing API only, ops every member of it;
// analytics.vendor.example follows the default (deny), the others too.
func addPolicy(s *api.Snapshot) {
	s.TrustPolicy = &api.TrustPolicy{
		Sources: []api.PolicySource{
			{Source: "file:/etc/trustbridge/policy.yaml", Rules: 1, LastSuccess: ago(time.Hour)},
			{Source: "crd", Rules: 1, LastError: "ClusterTrustPolicy ops-wide: workloads[0]: empty selector"},
		},
		Rules: 2, Default: "deny", TextDigest: "5f1c0a9e", DecisionDigest: "0d2b7e",
		Conflicts: []string{`rule "payments-to-bank" (file:/etc/trustbridge/policy.yaml:4) limits partner-bank.example to some peers, but rule "ops" (crd:ops) grants it without a peer limit`},
		Grants: []api.PolicyGrant{
			{Rule: "payments-to-bank", Origin: "file:/etc/trustbridge/policy.yaml:4", TrustDomain: "partner-bank.example"},
			{Rule: "ops", Origin: "crd:ops", TrustDomain: "partner-bank.example"},
		},
	}
	for i := range s.TrustDomains {
		td := &s.TrustDomains[i]
		if td.Local {
			continue
		}
		td.TrustedBy = &api.TrustedBy{Default: "deny", Rules: []api.PolicyRule{}}
		if td.Name == "partner-bank.example" {
			td.TrustedBy.Governed = true
			td.TrustedBy.Rules = []api.PolicyRule{
				{Name: "payments-to-bank", Origin: "file:/etc/trustbridge/policy.yaml:4",
					Workloads: []string{"spiffe://prod.acme.example/ns/payments/*", "namespace=payments labels=tier=api"},
					Peers:     []string{"spiffe://partner-bank.example/ns/billing/sa/api"},
					Matched:   &api.PolicyMatches{Count: 3, Recent: []string{"spiffe://prod.acme.example/ns/payments/sa/checkout"}}},
				{Name: "ops", Origin: "crd:ops", Workloads: []string{"spiffe://prod.acme.example/ns/ops/*"}, Peers: []string{}},
			}
		}
	}
}

// manySnapshot has a local trust domain and n federated ones, in mixed
// states.
func manySnapshot(n int) api.Snapshot {
	s := api.Snapshot{Time: fixtureNow, TrustDomain: "hub.example", Actor: "hub-0", Leader: true}
	s.TrustDomains = append(s.TrustDomains, api.TrustDomain{Name: "hub.example", Local: true, Sources: []string{"ca"},
		Authorities: []api.Authority{localRoot("active", "CN=hub root", "2026-06-01T00:00:00Z", "2027-06-01T00:00:00Z", nil)}})
	states := []string{"ok", "failing", "stale", "pending"}
	for i := range n {
		name := fmt.Sprintf("spoke-%02d.a-rather-long-subdomain.example", i)
		td := api.TrustDomain{Name: name, Sources: []string{"federation:" + name},
			Authorities: []api.Authority{root("CN="+name, "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z")}}
		if i%5 == 4 {
			td.Sources = []string{"file:/etc/bundles/" + name + ".json"}
		} else {
			td.Federation = &api.Federation{EndpointURL: "https://" + name + "/bundle", Profile: "https_web", State: states[i%4]}
		}
		s.TrustDomains = append(s.TrustDomains, td)
	}
	return s
}

// hostile is markup and script in every free-text place a snapshot has.
const hostile = `"><script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)>`

func hostileSnapshot() (api.Snapshot, []api.Finding) {
	a := root("CN="+hostile+",O="+hostile, "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z")
	a.SHA256 = hostile
	a.SignatureAlgorithm, a.PublicKeyAlgorithm, a.State = hostile, hostile, hostile
	k := jwtKey(hostile)
	s := api.Snapshot{
		Time: fixtureNow, TrustDomain: hostile, Actor: hostile,
		TrustDomains: []api.TrustDomain{
			{Name: hostile, Local: true, Sources: []string{hostile}, Authorities: []api.Authority{a, k}},
			{Name: "evil" + hostile, Sources: []string{"file:" + hostile}, Authorities: []api.Authority{a}},
			{Name: "fed" + hostile, Sources: []string{hostile},
				Federation: &api.Federation{
					EndpointURL: "javascript:alert(4)//" + hostile, Profile: hostile, EndpointSPIFFEID: hostile,
					Origin: "crd:" + hostile, State: hostile, LastError: hostile, ConsecutiveFailures: 1,
					Refusals: map[string]uint64{hostile: 1},
				},
				Authorities: []api.Authority{a}},
		},
	}
	s.TrustPolicy = &api.TrustPolicy{Default: hostile, Conflicts: []string{hostile},
		Sources: []api.PolicySource{{Source: hostile, LastError: hostile}, {Source: hostile}}}
	s.TrustDomains[2].TrustedBy = &api.TrustedBy{Default: hostile, Governed: true, Rules: []api.PolicyRule{{
		Name: hostile, Origin: hostile, Workloads: []string{hostile}, Peers: []string{hostile},
		Matched: &api.PolicyMatches{Count: 1, Recent: []string{hostile}},
	}}}
	s.CA = &api.CAStatus{Upstream: &api.UpstreamStatus{Name: hostile, LastError: hostile, Failures: 1, FailingSince: at("2026-11-22T11:00:00Z")}}
	s.OIDCIssuers = []api.OIDCIssuer{{URL: "javascript:alert(5)//" + hostile, TrustDomain: hostile, ServedHere: true,
		DiscoveryURL: hostile, JWKSURL: hostile, Keys: []api.OIDCIssuerKey{{KID: hostile, Algorithm: hostile, Use: hostile}},
		Certificate: &api.OIDCIssuerCertificate{Names: []string{hostile}, Reason: hostile}, Error: hostile}}
	fs := []api.Finding{{Severity: api.Severity(hostile), Code: hostile, TrustDomain: hostile, Authority: hostile, Message: hostile, Fix: hostile}}
	return s, fs
}
