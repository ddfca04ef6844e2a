package policycrd

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

var local = spiffeid.RequireTrustDomainFromString("example.org")

func validSpec() Spec {
	return Spec{
		Workloads: []WorkloadSelector{
			{SPIFFEID: "spiffe://example.org/ns/payments/*"},
			{Namespace: "payments", Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}},
		},
		TrustDomains: []TrustDomainGrant{
			{Name: "partner.example", Peers: []string{"spiffe://partner.example/ns/billing/sa/api", "spiffe://partner.example/ns/ops/*"}},
			{Name: "other.example"},
		},
	}
}

func TestRuleOf(t *testing.T) {
	spec := validSpec()
	r := RuleOf("payments-to-partner", spec)
	assert.Equal(t, trustpolicy.Rule{
		Name: "clustertrustpolicy/payments-to-partner", Origin: "crd:payments-to-partner",
		Workloads: []trustpolicy.Selector{
			{SPIFFEID: "spiffe://example.org/ns/payments/*"},
			{Namespace: "payments", Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}},
		},
		TrustDomains: []trustpolicy.TrustDomainGrant{
			{TrustDomain: "partner.example", Peers: []string{"spiffe://partner.example/ns/billing/sa/api", "spiffe://partner.example/ns/ops/*"}},
			{TrustDomain: "other.example"},
		},
	}, r)
	require.NoError(t, Check(local, r))

	// The rule shares nothing with the spec: an informer's cached object
	// is never changed through it.
	r.Workloads[1].Labels.MatchLabels["tier"] = "x"
	r.TrustDomains[0].Peers[0] = "x"
	assert.Equal(t, validSpec(), spec)
}

// A refused spec's message names the field, as kubectl explain spells it.
func TestCheckNamesTheField(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Spec)
		want string
	}{
		{"bad pattern", func(s *Spec) { s.Workloads[0].SPIFFEID = "spiffe://example.org/ns/pay*" }, `spec.workloads[0].spiffeID: pattern "spiffe://example.org/ns/pay*"`},
		{"dot segment", func(s *Spec) { s.Workloads[0].SPIFFEID = "spiffe://example.org/ns/../x" }, "spec.workloads[0].spiffeID: pattern"},
		{"foreign workload", func(s *Spec) { s.Workloads[0].SPIFFEID = "spiffe://partner.example/ns/x/*" }, `spec.workloads[0].spiffeID: spiffeID "spiffe://partner.example/ns/x/*" is not in the local trust domain`},
		{"bad labels", func(s *Spec) {
			s.Workloads[1].Labels = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Near"}}}
		}, "spec.workloads[1].labels: "},
		{"empty selector", func(s *Spec) { s.Workloads[1] = WorkloadSelector{} }, "spec.workloads[1]: empty selector"},
		{"empty labels", func(s *Spec) { s.Workloads[1].Labels = &metav1.LabelSelector{} }, "spec.workloads[1].labels: empty label selector"},
		{"no workloads", func(s *Spec) { s.Workloads = nil }, "spec.workloads: a rule must select at least one workload"},
		{"no trust domains", func(s *Spec) { s.TrustDomains = nil }, "spec.trustDomains: a rule must grant"},
		{"trust domain with scheme", func(s *Spec) { s.TrustDomains[1].Name = "spiffe://other.example" }, `spec.trustDomains[1].name: trust domain "spiffe://other.example"`},
		{"local trust domain", func(s *Spec) { s.TrustDomains[1].Name = "example.org" }, `spec.trustDomains[1].name: trust domain "example.org" is the local one`},
		{"twice", func(s *Spec) { s.TrustDomains[1].Name = "partner.example" }, `spec.trustDomains[1].name: trust domain "partner.example" is listed twice`},
		{"foreign peer", func(s *Spec) { s.TrustDomains[0].Peers[1] = "spiffe://other.example/x" }, `spec.trustDomains[0].peers[1]: "spiffe://other.example/x" is not in trust domain "partner.example"`},
		{"regex peer", func(s *Spec) { s.TrustDomains[0].Peers[0] = "spiffe://partner.example/ns/.*" }, "spec.trustDomains[0].peers[0]: pattern"},
		{"too many workloads", func(s *Spec) { s.Workloads = make([]WorkloadSelector, MaxWorkloads+1) }, "spec.workloads: 65 selectors, at most 64"},
		{"too many trust domains", func(s *Spec) { s.TrustDomains = make([]TrustDomainGrant, MaxTrustDomains+1) }, "spec.trustDomains: 65 trust domains"},
		{"too many peers", func(s *Spec) { s.TrustDomains[0].Peers = make([]string, MaxPeers+1) }, "spec.trustDomains[0].peers: 257 peers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := validSpec()
			tt.edit(&spec)
			err := Check(local, RuleOf("r", spec))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "rule 1", "the resource is the rule; no position within a file")
		})
	}
}

func TestFieldOfUnknownMessage(t *testing.T) {
	assert.Equal(t, "spec: something new", fieldOf("something new"))
	assert.Equal(t, "spec.workloads[3]: something new", fieldOf("workloads[3]: something new"))
}

// FuzzCheck: whatever a resource holds, Check either refuses it or the
// rule compiles, named by the resource, in a policy with other rules.
func FuzzCheck(f *testing.F) {
	b, err := json.Marshal(validSpec())
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte(`{"workloads":[{"labels":{"matchExpressions":[{"key":"a","operator":"In","values":["b"]}]}}],"trustDomains":[{"name":"x.test"}]}`))
	f.Add([]byte(`{"workloads":[{}],"trustDomains":[{"name":"x.test","peers":["spiffe://x.test/*"]}]}`))
	other := trustpolicy.Rule{Name: "file-rule", Origin: "file:p:1", Workloads: []trustpolicy.Selector{{Namespace: "a"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example"}}}
	f.Fuzz(func(t *testing.T, data []byte) {
		var spec Spec
		if json.Unmarshal(data, &spec) != nil {
			return
		}
		r := RuleOf("fuzz", spec)
		if err := Check(local, r); err != nil {
			if !strings.HasPrefix(err.Error(), "spec") {
				t.Fatalf("message names no field: %v", err)
			}
			return
		}
		p, err := trustpolicy.Compile(local, trustpolicy.DefaultDeny, []trustpolicy.Rule{other, r})
		if err != nil {
			t.Fatalf("checked alone but refused with another rule: %v", err)
		}
		for _, g := range r.TrustDomains {
			if !p.Governed(spiffeid.RequireTrustDomainFromString(g.TrustDomain)) {
				t.Fatalf("granted %s is not governed", g.TrustDomain)
			}
		}
	})
}
