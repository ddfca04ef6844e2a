package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// The ClusterTrustPolicy set the server reads first, with no resources,
// leaves the policy as it was: it is no trust_policy_changed entry. A set
// that changes the policy is one, from source "crd".
func TestApplyCRDAuditsOnlyChanges(t *testing.T) {
	var buf bytes.Buffer
	trail, err := newAuditTrail(audit.New(&buf), "replica-1", nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	o := policyServer(t, nil)
	p, err := setupPolicy(o, spiffeid.RequireTrustDomainFromString("example.org"), nil, trail, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	p.recordStart()
	events := func() []audit.Entry {
		var out []audit.Entry
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var e audit.Entry
			require.NoError(t, json.Unmarshal([]byte(line), &e))
			out = append(out, e)
		}
		return out
	}
	require.Len(t, events(), 1, "the start")

	require.NoError(t, p.applyCRD(nil))
	assert.Len(t, events(), 1, "no resources: nothing changed")

	rule := trustpolicy.Rule{Name: "clustertrustpolicy/ops", Origin: "crd:ops",
		Workloads:    []trustpolicy.Selector{{SPIFFEID: "spiffe://example.org/ns/ops/*"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example"}}}
	require.NoError(t, p.applyCRD([]trustpolicy.Rule{rule}))
	require.NoError(t, p.applyCRD([]trustpolicy.Rule{rule}))
	evs := events()
	require.Len(t, evs, 2, "one change, read twice")
	assert.Equal(t, EventPolicyChanged, evs[1].Event)
	require.NotNil(t, evs[1].Policy)
	assert.Equal(t, CRDPolicySource, evs[1].Policy.Source)
	assert.Equal(t, []string{rule.Name}, evs[1].Policy.RulesAdded)
}
