package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// testRules grant peer.example to payments (limited to billing's API)
// and to ops (every member), and far.example, which the server does not
// federate with, to ops.
func testRules() []trustpolicy.Rule {
	return []trustpolicy.Rule{
		{
			Name: "payments-to-peer", Origin: "file:/etc/policy.yaml:3",
			Workloads: []trustpolicy.Selector{
				{SPIFFEID: "spiffe://example.org/ns/payments/*"},
				{Namespace: "payments", Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}},
			},
			TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "peer.example", Peers: []string{"spiffe://peer.example/ns/billing/sa/api"}}},
		},
		{
			Name: "ops", Origin: "crd:ops",
			Workloads:    []trustpolicy.Selector{{SPIFFEID: "spiffe://example.org/ns/ops/*"}},
			TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "peer.example"}, {TrustDomain: "far.example"}},
		},
	}
}

func withPolicy(t *testing.T, f *fixture, def trustpolicy.Default, rules []trustpolicy.Rule) {
	t.Helper()
	var p *trustpolicy.Policy
	if def != "" {
		var err error
		p, err = trustpolicy.Compile(localTD, def, rules)
		require.NoError(t, err)
	}
	f.cfg.Policy = &PolicyConfig{
		Cell: trustpolicy.NewCell(p),
		Statuses: func() []trustpolicy.Status {
			return []trustpolicy.Status{{Source: "file:/etc/policy.yaml", Rules: 1, LastSuccess: t0.Unix()}, {Source: "crd", Rules: 1, LastError: "rule \"x\": no workloads"}}
		},
		Matches: func(rule string) (uint64, []string) {
			if rule == "ops" {
				return 2, []string{"spiffe://example.org/ns/ops/sa/a"}
			}
			return 0, nil
		},
	}
}

// The snapshot says, per trust domain, which rules let which workloads
// trust it, and at the top the policy's sources, size, default and
// conflicts.
func TestSnapshotTrustPolicy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	withPolicy(t, f, trustpolicy.DefaultDeny, testRules())
	snap := New(f.cfg).Snapshot()

	tp := snap.TrustPolicy
	require.NotNil(t, tp)
	assert.Equal(t, 2, tp.Rules)
	assert.Equal(t, "deny", tp.Default)
	p, _ := f.cfg.Policy.Cell.Load()
	assert.Equal(t, p.TextDigest(), tp.TextDigest, "the audit log's digest_after, to match entries to the policy shown")
	assert.Len(t, tp.TextDigest, 64)
	assert.Equal(t, p.Digest(), tp.DecisionDigest)
	require.Len(t, tp.Sources, 2)
	assert.Equal(t, "file:/etc/policy.yaml", tp.Sources[0].Source)
	require.NotNil(t, tp.Sources[0].LastSuccess)
	assert.Equal(t, t0, *tp.Sources[0].LastSuccess)
	assert.Equal(t, `rule "x": no workloads`, tp.Sources[1].LastError)
	require.Len(t, tp.Conflicts, 1)
	assert.Contains(t, tp.Conflicts[0], `rule "payments-to-peer" (file:/etc/policy.yaml:3) limits peer.example`)
	assert.Contains(t, tp.Conflicts[0], `rule "ops" (crd:ops) grants peer.example without peers`)
	assert.Equal(t, []api.PolicyGrant{
		{Rule: "payments-to-peer", Origin: "file:/etc/policy.yaml:3", TrustDomain: "peer.example"},
		{Rule: "ops", Origin: "crd:ops", TrustDomain: "peer.example"},
		{Rule: "ops", Origin: "crd:ops", TrustDomain: "far.example"},
	}, tp.Grants)

	require.Len(t, snap.TrustDomains, 2)
	assert.Nil(t, snap.TrustDomains[0].TrustedBy, "the local trust domain: every workload")
	tb := snap.TrustDomains[1].TrustedBy
	require.NotNil(t, tb)
	assert.True(t, tb.Governed)
	assert.Equal(t, "deny", tb.Default)
	assert.False(t, tb.Everyone())
	require.Len(t, tb.Rules, 2)
	assert.Equal(t, api.PolicyRule{
		Name: "payments-to-peer", Origin: "file:/etc/policy.yaml:3",
		Workloads: []string{"spiffe://example.org/ns/payments/*", "namespace=payments labels=tier=api"},
		Peers:     []string{"spiffe://peer.example/ns/billing/sa/api"},
		Matched:   &api.PolicyMatches{Count: 0, Recent: []string{}},
	}, tb.Rules[0])
	assert.Equal(t, []string{}, tb.Rules[1].Peers, "every member")
	assert.Equal(t, &api.PolicyMatches{Count: 2, Recent: []string{"spiffe://example.org/ns/ops/sa/a"}}, tb.Rules[1].Matched)
}

// No policy: every federated trust domain is trusted by every workload,
// and the snapshot says so (what `trustbridge audit` flags).
func TestSnapshotNoTrustPolicy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	withPolicy(t, f, "", nil)
	f.cfg.Policy.Statuses = nil
	snap := New(f.cfg).Snapshot()
	require.NotNil(t, snap.TrustPolicy)
	assert.True(t, snap.TrustPolicy.None())
	assert.Empty(t, snap.TrustPolicy.Sources)
	tb := snap.TrustDomains[1].TrustedBy
	require.NotNil(t, tb)
	assert.True(t, tb.Everyone())
	assert.Empty(t, tb.Rules)

	// Without the wiring, nothing is said (a server predating policies).
	f.cfg.Policy = nil
	snap = New(f.cfg).Snapshot()
	assert.Nil(t, snap.TrustPolicy)
	assert.Nil(t, snap.TrustDomains[1].TrustedBy)
	assert.Equal(t, http.StatusNotFound, do(t, New(f.cfg), http.MethodGet, "/v1/policy/explain?spiffe_id=spiffe://example.org/a").Code)
}

func TestPolicyExplainRefusesBadQueries(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	withPolicy(t, f, trustpolicy.DefaultDeny, testRules())
	h := New(f.cfg)
	for _, tc := range []struct{ name, query, want string }{
		{"no id", "", "spiffe_id \"\""},
		{"not a SPIFFE ID", "spiffe_id=https://example.org/a", "want spiffe://example.org/<path>"},
		{"another trust domain", "spiffe_id=spiffe://peer.example/a", "is not a workload of example.org"},
		{"namespace alone", "spiffe_id=spiffe://example.org/a&namespace=ns", "namespace and service_account go together"},
		{"too long", "spiffe_id=spiffe://example.org/" + strings.Repeat("a", 2100), "spiffe_id: longer than 2048 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := do(t, h, http.MethodGet, "/v1/policy/explain?"+tc.query)
			assert.Equal(t, http.StatusBadRequest, rec.Code)
			assert.Contains(t, body(t, rec), tc.want)
		})
	}
	assert.Equal(t, http.StatusMethodNotAllowed, do(t, h, http.MethodPost, "/v1/policy/explain").Code)
}

// The explanation names the workload as asked and covers every trust
// domain the server trusts, local first.
func TestPolicyExplain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	withPolicy(t, f, trustpolicy.DefaultDeny, testRules())
	q := url.Values{"spiffe_id": {"spiffe://example.org/ns/payments/sa/api"}, "namespace": {"payments"}, "service_account": {"api"}}
	rec := do(t, New(f.cfg), http.MethodGet, "/v1/policy/explain?"+q.Encode())
	b := body(t, rec)
	require.Equal(t, http.StatusOK, rec.Code, b)
	assert.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	var ex api.Explanation
	require.NoError(t, json.Unmarshal([]byte(b), &ex))
	assert.Equal(t, "spiffe://example.org/ns/payments/sa/api", ex.SPIFFEID)
	assert.Equal(t, "payments", ex.Namespace)
	assert.Equal(t, "api", ex.ServiceAccount)
	assert.NotNil(t, ex.Matched)
	assert.NotNil(t, ex.TrustDomains)
}

// Explain needs no token, so without one it does not read service
// account labels: an unauthenticated caller cannot probe which accounts
// exist and which labels they carry. With the admin token or on the
// admin socket it does; a wrong token is refused.
func TestPolicyExplainLabelsNeedToken(t *testing.T) {
	t.Parallel()
	// The workload's SPIFFE ID is outside the rule's prefix: only its
	// second selector, namespace and labels, can select it.
	q := url.Values{"spiffe_id": {"spiffe://example.org/sa/api"}, "namespace": {"payments"}, "service_account": {"api"}}
	target := "/v1/policy/explain?" + q.Encode()
	tests := []struct {
		name       string
		socket     bool
		header     []string
		wantCode   int
		wantLookup bool
	}{
		{"no token", false, nil, http.StatusOK, false},
		{"admin token", false, []string{"Authorization", "Bearer s3cret"}, http.StatusOK, true},
		{"admin socket", true, nil, http.StatusOK, true},
		{"wrong token", false, []string{"Authorization", "Bearer guess"}, http.StatusUnauthorized, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			withPolicy(t, f, trustpolicy.DefaultDeny, testRules())
			f.cfg.Token = "s3cret"
			var lookups []string
			var mu sync.Mutex
			f.cfg.Policy.Labels = func(ns, sa string) map[string]string {
				mu.Lock()
				defer mu.Unlock()
				lookups = append(lookups, ns+"/"+sa)
				return map[string]string{"tier": "api"}
			}
			req := httptest.NewRequest(http.MethodGet, target, nil)
			for i := 0; i+1 < len(tt.header); i += 2 {
				req.Header.Set(tt.header[i], tt.header[i+1])
			}
			if tt.socket {
				req = req.WithContext(OverSocket(req.Context()))
			}
			rec := httptest.NewRecorder()
			New(f.cfg).ServeHTTP(rec, req)
			b := body(t, rec)
			require.Equal(t, tt.wantCode, rec.Code, b)
			if !tt.wantLookup {
				assert.Empty(t, lookups, "labels not looked up")
			}
			if tt.wantCode != http.StatusOK {
				return
			}
			var ex api.Explanation
			require.NoError(t, json.Unmarshal([]byte(b), &ex))
			if tt.wantLookup {
				assert.Equal(t, []string{"payments/api"}, lookups)
				assert.Empty(t, ex.LabelsNote)
				assert.Equal(t, []api.ExplainedMatch{{Rule: "payments-to-peer", Origin: "file:/etc/policy.yaml:3", Selector: 1}}, ex.Matched)
				return
			}
			assert.Equal(t, api.LabelsNotLookedUp, ex.LabelsNote)
			assert.Empty(t, ex.Matched, "label selectors select nothing without labels")
		})
	}
}

// An explain request, which needs no token, lists the trust domains
// without building a snapshot: no source statuses, no rule matches, no
// CA roots read.
func TestPolicyExplainBuildsNoSnapshot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	withPolicy(t, f, trustpolicy.DefaultDeny, testRules())
	var snapshotWork int
	f.cfg.Policy.Statuses = func() []trustpolicy.Status { snapshotWork++; return nil }
	f.cfg.Policy.Matches = func(string) (uint64, []string) { snapshotWork++; return 0, nil }
	h := New(f.cfg)
	require.NotEmpty(t, h.Snapshot().TrustDomains)
	require.Positive(t, snapshotWork, "the counters see a snapshot")
	snapshotWork = 0

	rec := do(t, h, http.MethodGet, "/v1/policy/explain?spiffe_id=spiffe://example.org/ns/ops/sa/a")
	b := body(t, rec)
	require.Equal(t, http.StatusOK, rec.Code, b)
	assert.Zero(t, snapshotWork)
	var ex api.Explanation
	require.NoError(t, json.Unmarshal([]byte(b), &ex))
	var tds []string
	for _, td := range ex.TrustDomains {
		tds = append(tds, td.TrustDomain)
	}
	assert.Equal(t, []string{"example.org", "peer.example"}, tds, "the snapshot's trust domains, local first")
}
