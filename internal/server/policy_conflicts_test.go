package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// A ClusterTrustPolicy's status lists the conflicts its rule is part of,
// restricting or lifting, and no other rule's.
func TestPolicyConflictsOf(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	c, err := newPolicyCombiner(td, trustpolicy.DefaultAllow, trustpolicy.NewCell(nil), prometheus.NewRegistry(), func(trustpolicy.Publish) {})
	require.NoError(t, err)
	grant := func(peers ...string) []trustpolicy.TrustDomainGrant {
		return []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example", Peers: peers}}
	}
	require.NoError(t, c.SetSource("crd", []trustpolicy.Rule{
		{Name: "limited", Origin: "crd:limited", Workloads: []trustpolicy.Selector{{Namespace: "pay"}}, TrustDomains: grant("spiffe://partner.example/api")},
		{Name: "wide", Origin: "crd:wide", Workloads: []trustpolicy.Selector{{Namespace: "pay"}}, TrustDomains: grant()},
		{Name: "elsewhere", Origin: "crd:elsewhere", Workloads: []trustpolicy.Selector{{Namespace: "web"}}, TrustDomains: grant("spiffe://partner.example/web")},
	}))
	p := &policySetup{combiner: c}
	require.Len(t, p.conflictsOf("limited"), 1)
	assert.Contains(t, p.conflictsOf("limited")[0], `rule "limited" (crd:limited) limits partner.example`)
	assert.Equal(t, p.conflictsOf("limited"), p.conflictsOf("wide"))
	assert.Empty(t, p.conflictsOf("elsewhere"))
}
