package mapcrd

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
)

func TestRuleOfAndCheck(t *testing.T) {
	uid := int64(65534)
	r, err := RuleOf("exporter", Spec{Workloads: []WorkloadSelector{{UID: &uid, BinaryPath: "/usr/bin/node_exporter"}},
		SPIFFEID: "spiffe://{{.TrustDomain}}/node/exporter", TTL: "30m"})
	require.NoError(t, err)
	assert.Equal(t, "crd:exporter", r.Origin)
	assert.Equal(t, 30*time.Minute, r.TTL)
	require.NotNil(t, r.Workloads[0].UID)
	assert.Equal(t, uint32(65534), *r.Workloads[0].UID)
	require.NoError(t, Check(identitymap.Config{TrustDomain: local}, r))

	big := int64(1 << 32)
	_, err = RuleOf("x", Spec{Workloads: []WorkloadSelector{{GID: &big}}, SPIFFEID: "spiffe://{{.TrustDomain}}/x"})
	assert.ErrorContains(t, err, "spec.workloads[0].gid: 4294967296")
	_, err = RuleOf("x", Spec{Workloads: []WorkloadSelector{{Namespace: "a"}}, SPIFFEID: "spiffe://{{.TrustDomain}}/x", TTL: "-1h"})
	assert.ErrorContains(t, err, "spec.ttl")

	for spec, want := range map[*Spec]string{
		{Workloads: []WorkloadSelector{{}}, SPIFFEID: "spiffe://{{.TrustDomain}}/x"}:                                          "spec.workloads[0]: empty selector",
		{Workloads: []WorkloadSelector{{Namespace: "a"}}, SPIFFEID: "spiffe://other.org/x"}:                                   "spec.spiffeID: ",
		{Workloads: []WorkloadSelector{{Namespace: "a"}}, SPIFFEID: "spiffe://{{.TrustDomain}}/x", TTL: "10s"}:                "spec.ttl 10s: shorter than the minimum",
		{Workloads: []WorkloadSelector{{Namespace: "a"}}, SPIFFEID: "spiffe://{{.TrustDomain}}/x", DNSNames: []string{"A.b"}}: "spec.dnsNames[0]: ",
	} {
		r, err := RuleOf("x", *spec)
		require.NoError(t, err)
		assert.ErrorContains(t, Check(identitymap.Config{TrustDomain: local}, r), want)
	}
}
