package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

func TestClusterTrustBundleFindings(t *testing.T) {
	s := api.Snapshot{TrustDomain: "example.org", ClusterTrustBundles: &api.ClusterTrustBundles{
		Signer: "trustbridge.io/svid",
		Skipped: []api.SkippedTrustBundle{
			{TrustDomain: "big.example", Reason: "too_large", Message: "its 900 CA certificates are 1100000 bytes of PEM"},
			{TrustDomain: "leafy.example", Reason: "no_ca_authorities", Message: "none of its 1 X.509 authorities is a CA certificate"},
		},
	}}
	var got []api.Finding
	for _, f := range Findings(s) {
		if f.Code == CodeClusterTrustBundleSkipped {
			got = append(got, f)
		}
	}
	require.Len(t, got, 2)
	assert.Equal(t, "big.example", got[0].TrustDomain)
	assert.Equal(t, api.SeverityWarning, got[0].Severity)
	assert.Contains(t, got[0].Message, "big.example has no ClusterTrustBundle of signer trustbridge.io/svid (too_large)")
	assert.Contains(t, got[0].Fix, "1 MiB")
	assert.Contains(t, got[1].Fix, "CA bit")

	s.ClusterTrustBundles.Skipped = nil
	for _, f := range Findings(s) {
		assert.NotEqual(t, CodeClusterTrustBundleSkipped, f.Code)
	}
}
