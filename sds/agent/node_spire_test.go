package agent

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/spiretest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// For the same caller (this process, by its uid) with the same identity,
// federated with the same peer, the node agent answers Istio's SDS
// requests as spire-agent v1.13.3 does with default_all_bundles_name =
// "ROOTCA" and the unix workload attestor, field by field: "default" an
// X509-SVID of that ID alone, inline, with its key; "ROOTCA" Envoy's
// SPIFFE validator holding the local trust domain and the peer, the
// peer's roots identical. The one difference is by nature: each serves
// its own CA's roots for the local trust domain (docs/node-agent.md lists
// the deliberate differences).
func TestNodeModeMatchesSPIRE(t *testing.T) {
	spiretest.RequireAgent(t)
	peer := testca.New(t, "peer.example")
	peerDoc, err := peer.Bundle().Marshal()
	require.NoError(t, err)
	s := spiretest.Start(t, spiretest.Config{TrustDomain: tdA.Name()})
	s.SetBundle(t, "peer.example", peerDoc)
	a := s.StartAgent(t, spiretest.AgentConfig{}) // Istio's names: default, and ROOTCA for every bundle
	e := a.RegisterUID(t, webID.String(), os.Getuid(), "peer.example")
	a.WaitSynced(t, e)
	spire := spiretest.EnvoySecrets(t, a.SDS(t), spiretest.DefaultSVIDName, spiretest.RootCAName)

	f := startNodeFixture(t, webID, webID)
	f.fed.replace(peer.Bundle())
	p, err := trustpolicy.Compile(tdA, trustpolicy.DefaultDeny, []trustpolicy.Rule{{
		Name: "shop", Workloads: []trustpolicy.Selector{{Namespace: "shop"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "peer.example"}},
	}})
	require.NoError(t, err)
	f.policy.Set(p)
	ours := spiretest.EnvoySecrets(t, spiretest.SDSClient(t, f.socket), spiretest.DefaultSVIDName, spiretest.RootCAName)

	assert.Equal(t, spire[spiretest.DefaultSVIDName].TypeURL, ours[spiretest.DefaultSVIDName].TypeURL)
	assert.Equal(t, spire[spiretest.DefaultSVIDName].Secrets, ours[spiretest.DefaultSVIDName].Secrets, "default, field by field")

	theirs, mine := spire[spiretest.RootCAName].Secrets, ours[spiretest.RootCAName].Secrets
	require.Len(t, theirs, 1)
	require.Len(t, mine, 1)
	require.NotNil(t, theirs[0].ValidationContext)
	require.NotNil(t, mine[0].ValidationContext)
	// Each its own CA's roots for the local trust domain; the rest equal.
	for _, vc := range []*spiretest.ValidationContext{theirs[0].ValidationContext, mine[0].ValidationContext} {
		require.Len(t, vc.TrustDomains, 2)
		require.Equal(t, tdA.Name(), vc.TrustDomains[0].Name, "the local trust domain first")
		assert.NotEmpty(t, vc.TrustDomains[0].Roots)
		vc.TrustDomains[0].Roots = nil
	}
	assert.Equal(t, theirs, mine, "ROOTCA, field by field, but the local roots")
	assert.Equal(t, []string{spiretest.RootSHA256(peer.Bundle().X509Authorities()[0])}, mine[0].ValidationContext.TrustDomains[1].Roots)
}
