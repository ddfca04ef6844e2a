package audit

import (
	"crypto/x509"
	"encoding/json"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func root(t *testing.T, td string, o testca.Options) api.Authority {
	t.Helper()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.AddDate(-1, 0, 0)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.AddDate(1, 0, 0)
	}
	return api.X509Authority(testca.New(t, td, o).Cert)
}

func local(auths ...api.Authority) api.TrustDomain {
	return api.TrustDomain{Name: "east.example", Local: true, Sources: []string{"ca"}, Authorities: auths}
}

func peer(name string, f *api.Federation, auths ...api.Authority) api.TrustDomain {
	return api.TrustDomain{Name: name, Sources: []string{"federation:" + name}, Federation: f, Authorities: auths}
}

func okFed(url string) *api.Federation {
	return &api.Federation{EndpointURL: url, Profile: "https_web", State: "ok"}
}

type found struct {
	sev  api.Severity
	code string
	td   string
}

func summary(fs []api.Finding) []found {
	out := []found{}
	for _, f := range fs {
		out = append(out, found{f.Severity, f.Code, f.TrustDomain})
	}
	return out
}

func TestFindings(t *testing.T) {
	healthy := root(t, "east.example", testca.Options{})
	shared := testca.New(t, "west.example", testca.Options{NotBefore: now.AddDate(-1, 0, 0), NotAfter: now.AddDate(2, 0, 0)})
	leafCA := testca.New(t, "west.example", testca.Options{NotBefore: now.AddDate(-1, 0, 0), NotAfter: now.AddDate(1, 0, 0)})
	leaf, _ := leafCA.Issue(t, spiffeid.RequireFromString("spiffe://west.example/w"), testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(0, 2, 0)})

	cases := []struct {
		name string
		tds  []api.TrustDomain
		want []found
	}{
		{"healthy", []api.TrustDomain{local(healthy), peer("west.example", okFed("https://west.example/"), root(t, "west.example", testca.Options{}))}, []found{}},
		{"expiring in 20 days", []api.TrustDomain{local(root(t, "east.example", testca.Options{NotAfter: now.AddDate(0, 0, 20)}))},
			[]found{{api.SeverityWarning, CodeExpiring, "east.example"}}},
		{"expiring in 5 days", []api.TrustDomain{local(root(t, "east.example", testca.Options{NotAfter: now.AddDate(0, 0, 5)}))},
			[]found{{api.SeverityCritical, CodeExpiring, "east.example"}}},
		{"expired", []api.TrustDomain{peer("west.example", okFed("https://w/"), root(t, "west.example", testca.Options{NotBefore: now.AddDate(-2, 0, 0), NotAfter: now.AddDate(0, 0, -1)}))},
			[]found{{api.SeverityCritical, CodeExpired, "west.example"}}},
		{"RSA 2048", []api.TrustDomain{local(root(t, "east.example", testca.Options{KeyType: testca.RSA2048}))},
			[]found{{api.SeverityWarning, CodeWeakKey, "east.example"}}},
		{"RSA 4096 is fine", []api.TrustDomain{local(root(t, "east.example", testca.Options{KeyType: testca.RSA4096}))}, []found{}},
		{"SHA-1 signature", []api.TrustDomain{local(root(t, "east.example", testca.Options{KeyType: testca.RSA4096,
			Mutate: func(c *x509.Certificate) { c.SignatureAlgorithm = x509.SHA1WithRSA }}))},
			[]found{{api.SeverityWarning, CodeWeakSignature, "east.example"}}},
		{"leaf in a bundle", []api.TrustDomain{peer("west.example", okFed("https://w/"), api.X509Authority(leaf))},
			[]found{{api.SeverityCritical, CodeNotCA, "west.example"}}},
		{"stale", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", State: "stale", LastError: "timeout"}, root(t, "west.example", testca.Options{}))},
			[]found{{api.SeverityWarning, CodeStale, "west.example"}}},
		{"never answered, nothing held", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", State: "failing",
			LastAttempt: &now, ConsecutiveFailures: 3, LastError: "connection refused"})},
			[]found{{api.SeverityCritical, CodeNeverFetched, "west.example"}}},
		{"first polls failed, nothing held: pending, no finding yet", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", State: "pending",
			LastAttempt: &now, ConsecutiveFailures: 2, LastError: "connection refused"})}, []found{}},
		{"never answered, bootstrap bundle held: stale, not critical", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", State: "stale",
			LastAttempt: &now, ConsecutiveFailures: 3, LastError: "connection refused"}, root(t, "west.example", testca.Options{}))},
			[]found{{api.SeverityWarning, CodeStale, "west.example"}}},
		{"failing after a success: the last good bundle held, no finding", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", State: "failing",
			LastAttempt: &now, LastSuccess: &now, ConsecutiveFailures: 1}, root(t, "west.example", testca.Options{}))}, []found{}},
		{"sequence regression seen", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", State: "failing",
			Refusals: map[string]uint64{"sequence_regression": 2, "timeout": 5}}, root(t, "west.example", testca.Options{}))},
			[]found{{api.SeverityCritical, CodeSequenceRegress, "west.example"}}},
		{"revoked authority brought back", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", State: "failing",
			Refusals: map[string]uint64{"revoked_authority": 1}}, root(t, "west.example", testca.Options{}))},
			[]found{{api.SeverityCritical, CodeRevokedReturned, "west.example"}}},
		{"profile fallback attempted", []api.TrustDomain{peer("west.example", &api.Federation{EndpointURL: "https://w/", Profile: "https_spiffe", State: "failing",
			Refusals: map[string]uint64{"profile_mismatch": 1}}, root(t, "west.example", testca.Options{}))},
			[]found{{api.SeverityCritical, CodeProfileFallback, "west.example"}}},
		{"not https", []api.TrustDomain{peer("west.example", okFed("http://west.example/"), root(t, "west.example", testca.Options{}))},
			[]found{{api.SeverityCritical, CodeNotHTTPS, "west.example"}}},
		{"one root for two trust domains", []api.TrustDomain{local(healthy),
			peer("north.example", okFed("https://n/"), api.X509Authority(shared.Cert)),
			peer("west.example", okFed("https://w/"), api.X509Authority(shared.Cert))},
			[]found{{api.SeverityCritical, CodeSharedRoot, "north.example,west.example"}}},
		{"critical first", []api.TrustDomain{
			local(root(t, "east.example", testca.Options{NotAfter: now.AddDate(0, 0, 20)})),
			peer("west.example", okFed("http://w/"), root(t, "west.example", testca.Options{}))},
			[]found{{api.SeverityCritical, CodeNotHTTPS, "west.example"}, {api.SeverityWarning, CodeExpiring, "east.example"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", TrustDomains: tc.tds})
			assert.Equal(t, tc.want, summary(fs))
			for _, f := range fs {
				assert.NotEmpty(t, f.Message)
				assert.NotEmpty(t, f.Fix, "every finding says how to fix it")
			}
		})
	}
}

// Findings judge the certificate, not what the server claims about it.
func TestFindingsReadTheCertificate(t *testing.T) {
	a := root(t, "west.example", testca.Options{KeyType: testca.RSA2048})
	a.KeyBits, a.IsCA = 4096, true
	leaf := a
	fs := Findings(api.Snapshot{Time: now, TrustDomains: []api.TrustDomain{peer("west.example", okFed("https://w/"), leaf)}})
	assert.Equal(t, []found{{api.SeverityWarning, CodeWeakKey, "west.example"}}, summary(fs))

	a.Certificate = []byte("garbage")
	fs = Findings(api.Snapshot{Time: now, TrustDomains: []api.TrustDomain{peer("west.example", okFed("https://w/"), a)}})
	assert.Equal(t, []found{{api.SeverityCritical, CodeUnparsableAuthor, "west.example"}}, summary(fs))
}

func TestAtLeast(t *testing.T) {
	w := []api.Finding{{Severity: api.SeverityWarning}}
	c := []api.Finding{{Severity: api.SeverityCritical}}
	assert.True(t, AtLeast(w, api.SeverityWarning))
	assert.False(t, AtLeast(w, api.SeverityCritical))
	assert.True(t, AtLeast(c, api.SeverityWarning))
	assert.True(t, AtLeast(c, api.SeverityCritical))
	assert.False(t, AtLeast(nil, api.SeverityWarning))
}

// A snapshot comes from an admin endpoint: whatever it holds, Findings
// does not panic, and every finding is complete.
func FuzzFindings(f *testing.F) {
	f.Add([]byte(`{"time":"2026-11-22T12:00:00Z","trust_domains":[{"name":"a","authorities":[{"kind":"x509","sha256":"aa","certificate":"AAAA"}],"federation":{"endpoint_url":"%zz","state":"stale","refusals":{"sequence_regression":1}}}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"time":"2026-11-22T12:00:00Z","trust_domains":[{"name":"a","local":true,"jwt_issuer":true,"authorities":[{"kind":"jwt","key_id":"k","public_key":"AAAA","state":"active","jwt_key":{"created_at":"2026-11-23T00:00:00Z","not_after":"2026-11-22T12:00:00Z"}},{"kind":"jwt","key_id":"r","public_key_algorithm":"RSA","key_bits":512}]}]}`))
	f.Add([]byte(`{"trust_domains":[{"name":"a","local":true},{"name":"b"}],"trust_policy":{"default":"allow","rules":0,"conflicts":["x"],"grants":[{"rule":"r","trust_domain":"c"}],"sources":[{"source":"crd","last_error":"e"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s api.Snapshot
		if json.Unmarshal(data, &s) != nil {
			return
		}
		for _, fd := range Findings(s) {
			require.NotEmpty(t, fd.Message)
			require.NotEmpty(t, fd.Fix)
			require.Contains(t, []api.Severity{api.SeverityWarning, api.SeverityCritical}, fd.Severity)
		}
	})
}
