package audit

import (
	"crypto/x509"
	"encoding/json"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/trustview"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func root(t *testing.T, td string, o testca.Options) trustview.Authority {
	t.Helper()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.AddDate(-1, 0, 0)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.AddDate(1, 0, 0)
	}
	return trustview.X509Authority(testca.New(t, td, o).Cert)
}

func local(auths ...trustview.Authority) trustview.TrustDomain {
	return trustview.TrustDomain{Name: "east.example", Local: true, Sources: []string{"ca"}, Authorities: auths}
}

func peer(name string, f *trustview.Federation, auths ...trustview.Authority) trustview.TrustDomain {
	return trustview.TrustDomain{Name: name, Sources: []string{"federation:" + name}, Federation: f, Authorities: auths}
}

func okFed(url string) *trustview.Federation {
	return &trustview.Federation{EndpointURL: url, Profile: "https_web", State: "ok"}
}

type found struct {
	sev  trustview.Severity
	code string
	td   string
}

func summary(fs []trustview.Finding) []found {
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
		tds  []trustview.TrustDomain
		want []found
	}{
		{"healthy", []trustview.TrustDomain{local(healthy), peer("west.example", okFed("https://west.example/"), root(t, "west.example", testca.Options{}))}, []found{}},
		{"expiring in 20 days", []trustview.TrustDomain{local(root(t, "east.example", testca.Options{NotAfter: now.AddDate(0, 0, 20)}))},
			[]found{{trustview.SeverityWarning, CodeExpiring, "east.example"}}},
		{"expiring in 5 days", []trustview.TrustDomain{local(root(t, "east.example", testca.Options{NotAfter: now.AddDate(0, 0, 5)}))},
			[]found{{trustview.SeverityCritical, CodeExpiring, "east.example"}}},
		{"expired", []trustview.TrustDomain{peer("west.example", okFed("https://w/"), root(t, "west.example", testca.Options{NotBefore: now.AddDate(-2, 0, 0), NotAfter: now.AddDate(0, 0, -1)}))},
			[]found{{trustview.SeverityCritical, CodeExpired, "west.example"}}},
		{"RSA 2048", []trustview.TrustDomain{local(root(t, "east.example", testca.Options{KeyType: testca.RSA2048}))},
			[]found{{trustview.SeverityWarning, CodeWeakKey, "east.example"}}},
		{"RSA 4096 is fine", []trustview.TrustDomain{local(root(t, "east.example", testca.Options{KeyType: testca.RSA4096}))}, []found{}},
		{"SHA-1 signature", []trustview.TrustDomain{local(root(t, "east.example", testca.Options{KeyType: testca.RSA4096,
			Mutate: func(c *x509.Certificate) { c.SignatureAlgorithm = x509.SHA1WithRSA }}))},
			[]found{{trustview.SeverityWarning, CodeWeakSignature, "east.example"}}},
		{"leaf in a bundle", []trustview.TrustDomain{peer("west.example", okFed("https://w/"), trustview.X509Authority(leaf))},
			[]found{{trustview.SeverityCritical, CodeNotCA, "west.example"}}},
		{"stale", []trustview.TrustDomain{peer("west.example", &trustview.Federation{EndpointURL: "https://w/", State: "stale", LastError: "timeout"}, root(t, "west.example", testca.Options{}))},
			[]found{{trustview.SeverityWarning, CodeStale, "west.example"}}},
		{"sequence regression seen", []trustview.TrustDomain{peer("west.example", &trustview.Federation{EndpointURL: "https://w/", State: "failing",
			Refusals: map[string]uint64{"sequence_regression": 2, "timeout": 5}}, root(t, "west.example", testca.Options{}))},
			[]found{{trustview.SeverityCritical, CodeSequenceRegress, "west.example"}}},
		{"profile fallback attempted", []trustview.TrustDomain{peer("west.example", &trustview.Federation{EndpointURL: "https://w/", Profile: "https_spiffe", State: "failing",
			Refusals: map[string]uint64{"profile_mismatch": 1}}, root(t, "west.example", testca.Options{}))},
			[]found{{trustview.SeverityCritical, CodeProfileFallback, "west.example"}}},
		{"not https", []trustview.TrustDomain{peer("west.example", okFed("http://west.example/"), root(t, "west.example", testca.Options{}))},
			[]found{{trustview.SeverityCritical, CodeNotHTTPS, "west.example"}}},
		{"one root for two trust domains", []trustview.TrustDomain{local(healthy),
			peer("north.example", okFed("https://n/"), trustview.X509Authority(shared.Cert)),
			peer("west.example", okFed("https://w/"), trustview.X509Authority(shared.Cert))},
			[]found{{trustview.SeverityCritical, CodeSharedRoot, "north.example,west.example"}}},
		{"critical first", []trustview.TrustDomain{
			local(root(t, "east.example", testca.Options{NotAfter: now.AddDate(0, 0, 20)})),
			peer("west.example", okFed("http://w/"), root(t, "west.example", testca.Options{}))},
			[]found{{trustview.SeverityCritical, CodeNotHTTPS, "west.example"}, {trustview.SeverityWarning, CodeExpiring, "east.example"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(trustview.Snapshot{Time: now, TrustDomain: "east.example", TrustDomains: tc.tds})
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
	fs := Findings(trustview.Snapshot{Time: now, TrustDomains: []trustview.TrustDomain{peer("west.example", okFed("https://w/"), leaf)}})
	assert.Equal(t, []found{{trustview.SeverityWarning, CodeWeakKey, "west.example"}}, summary(fs))

	a.Certificate = []byte("garbage")
	fs = Findings(trustview.Snapshot{Time: now, TrustDomains: []trustview.TrustDomain{peer("west.example", okFed("https://w/"), a)}})
	assert.Equal(t, []found{{trustview.SeverityCritical, CodeUnparsableAuthor, "west.example"}}, summary(fs))
}

func TestAtLeast(t *testing.T) {
	w := []trustview.Finding{{Severity: trustview.SeverityWarning}}
	c := []trustview.Finding{{Severity: trustview.SeverityCritical}}
	assert.True(t, AtLeast(w, trustview.SeverityWarning))
	assert.False(t, AtLeast(w, trustview.SeverityCritical))
	assert.True(t, AtLeast(c, trustview.SeverityWarning))
	assert.True(t, AtLeast(c, trustview.SeverityCritical))
	assert.False(t, AtLeast(nil, trustview.SeverityWarning))
}

// A snapshot comes from an admin endpoint: whatever it holds, Findings
// does not panic, and every finding is complete.
func FuzzFindings(f *testing.F) {
	f.Add([]byte(`{"time":"2026-11-22T12:00:00Z","trust_domains":[{"name":"a","authorities":[{"kind":"x509","sha256":"aa","certificate":"AAAA"}],"federation":{"endpoint_url":"%zz","state":"stale","refusals":{"sequence_regression":1}}}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"time":"2026-11-22T12:00:00Z","trust_domains":[{"name":"a","local":true,"jwt_issuer":true,"authorities":[{"kind":"jwt","key_id":"k","public_key":"AAAA","state":"active","jwt_key":{"created_at":"2026-11-23T00:00:00Z","not_after":"2026-11-22T12:00:00Z"}},{"kind":"jwt","key_id":"r","public_key_algorithm":"RSA","key_bits":512}]}]}`))
	f.Add([]byte(`{"trust_domains":[{"name":"a","local":true},{"name":"b"}],"trust_policy":{"default":"allow","rules":0,"conflicts":["x"],"grants":[{"rule":"r","trust_domain":"c"}],"sources":[{"source":"crd","last_error":"e"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s trustview.Snapshot
		if json.Unmarshal(data, &s) != nil {
			return
		}
		for _, fd := range Findings(s) {
			require.NotEmpty(t, fd.Message)
			require.NotEmpty(t, fd.Fix)
			require.Contains(t, []trustview.Severity{trustview.SeverityWarning, trustview.SeverityCritical}, fd.Severity)
		}
	})
}
