package spiretest

import (
	"crypto/x509"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

const spiffeValidatorType = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig"

// TestAgentSDS is SPIRE's side of issue 34: spire-agent v1.13.3 serving
// an Envoy-like caller, registered by uid and federated with a peer, its
// SDS `default` and `ROOTCA`. With Istio's names (ROOTCA as
// default_all_bundles_name), ROOTCA is Envoy's SPIFFE validator holding
// the local trust domain and the peer, each with its roots. With ROOTCA
// as default_bundle_name too, SPIRE ignores default_all_bundles_name (and
// says so) and ROOTCA holds the local trust domain alone.
func TestAgentSDS(t *testing.T) {
	RequireAgent(t)
	peer := testca.New(t, "peer.example")
	peerDoc, err := peer.Bundle().Marshal()
	require.NoError(t, err)
	s := Start(t, Config{TrustDomain: "spire.example"})
	s.SetBundle(t, "peer.example", peerDoc)
	local, err := s.LocalBundle()
	require.NoError(t, err)
	localRoots := rootHashes(t, local.X509Authorities)
	peerRoots := []string{RootSHA256(peer.Cert)}

	const workload = "spiffe://spire.example/workload"
	for _, tc := range []struct {
		name         string
		cfg          AgentConfig
		trustDomains []TrustDomainRoots
	}{
		{"istio names", AgentConfig{}, []TrustDomainRoots{
			{Name: "peer.example", Source: "inline_bytes", Roots: peerRoots},
			{Name: "spire.example", Source: "inline_bytes", Roots: localRoots},
		}},
		{"ROOTCA for both names", AgentConfig{DefaultBundleName: RootCAName, DefaultAllBundlesName: RootCAName}, []TrustDomainRoots{
			{Name: "spire.example", Source: "inline_bytes", Roots: localRoots},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := s.StartAgent(t, tc.cfg)
			e := a.RegisterUID(t, workload, os.Getuid(), "peer.example")
			a.WaitSynced(t, e)

			c := a.SDS(t)
			got := EnvoySecrets(t, c, DefaultSVIDName, RootCAName)
			assert.Equal(t, []Secret{{
				Name: DefaultSVIDName, Kind: KindTLSCertificate,
				TLSCertificate: &TLSCertificate{
					URISANs: []string{workload}, ChainLength: 1, KeyMatchesLeaf: true,
					ChainSource: "inline_bytes", KeySource: "inline_bytes",
				},
			}}, got[DefaultSVIDName].Secrets)
			assert.Equal(t, []Secret{{
				Name: RootCAName, Kind: KindValidationContext,
				ValidationContext: &ValidationContext{
					Validator: SPIFFEValidatorName, ValidatorType: spiffeValidatorType,
					TrustDomains: tc.trustDomains,
				},
			}}, got[RootCAName].Secrets)

			// Both names on one stream, and in one FetchSecrets call, are
			// the same secrets.
			both := StreamSecrets(t, c, DefaultSVIDName, RootCAName)
			assert.ElementsMatch(t, append(got[DefaultSVIDName].Secrets, got[RootCAName].Secrets...), both.Secrets)
			assert.Equal(t, both.Secrets, FetchSecrets(t, c, DefaultSVIDName, RootCAName).Secrets)

			ignored := "configurables have the same value" // SPIRE's warning
			if tc.cfg.DefaultBundleName == tc.cfg.DefaultAllBundlesName && tc.cfg.DefaultBundleName != "" {
				assert.Contains(t, a.Logs(), ignored)
			} else {
				assert.NotContains(t, a.Logs(), ignored)
			}
		})
	}
}

func rootHashes(t *testing.T, ders [][]byte) []string {
	t.Helper()
	var out []string
	for _, der := range ders {
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		out = append(out, RootSHA256(c))
	}
	return out
}
