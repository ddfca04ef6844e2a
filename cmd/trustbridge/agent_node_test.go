package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/sds"
)

// A VM's node agent (trustbridge agent --node, no Kubernetes) with a
// reusable bootstrap token: the server lets it have exactly the
// identities --ca-node-agent lists for it. A process the identity map
// gives a listed identity gets that certificate over SDS, its ROOTCA the
// SPIFFE validator; one it gives an identity not listed is refused with
// the server's reason.
func TestAgentNodeOnAVM(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	app := servertest.LaptopID.String() + "/app"
	addr, rootCert, _ := grpcServerWithTokens(t, servertest.LaptopToken+","+servertest.LaptopID.String()+",reusable\n", func(o *server.Config) {
		o.GRPC.NodeAgents = []string{servertest.LaptopID.String() + "=" + app}
	})
	rootsPEM, err := os.ReadFile(rootCert)
	require.NoError(t, err)

	for _, tc := range []struct {
		name, id string
		refused  string
	}{
		{"listed", app, ""},
		{"not listed", servertest.LaptopID.String() + "/db", "is not among the identities listed for node agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := agentFor(t, addr, rootsPEM, servertest.LaptopToken)
			o.Node = agent.NodeConfig{Enabled: true, IdentityDefault: "none", IdentityMap: identityMapFile(t, tc.id)}
			o.WorkloadSocket = ""
			startAgent(t, o)
			resp, err := sdsFetch(t, o.Socket, sds.DefaultName, sds.RootCAName)
			if tc.refused != "" {
				require.Error(t, err)
				assert.Equal(t, codes.PermissionDenied, status.Code(err))
				assert.Contains(t, status.Convert(err).Message(), tc.refused)
				return
			}
			require.NoError(t, err)
			secrets := map[string]*tlsv3.Secret{}
			for _, r := range resp.GetResources() {
				var s tlsv3.Secret
				require.NoError(t, r.UnmarshalTo(&s))
				secrets[s.GetName()] = &s
			}
			chain, err := pemfile.ParseCertificates(secrets[sds.DefaultName].GetTlsCertificate().GetCertificateChain().GetInlineBytes())
			require.NoError(t, err)
			require.Len(t, chain[0].URIs, 1)
			assert.Equal(t, app, chain[0].URIs[0].String())
			assert.Equal(t, sds.SPIFFEValidatorName, secrets[sds.RootCAName].GetValidationContext().GetCustomValidatorConfig().GetName(),
				"--node serves ROOTCA as the SPIFFE validator by default")
		})
	}
}

// identityMapFile gives this process, by its uid, the identity id.
func identityMapFile(t *testing.T, id string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "identity-map.yaml")
	doc := fmt.Sprintf("rules:\n- name: this-test\n  workloads: [{uid: %d}]\n  spiffeID: %s\n", os.Getuid(), id)
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	return path
}

// sdsFetch asks the SDS socket for names with FetchSecrets, as this
// process.
func sdsFetch(t *testing.T, socket string, names ...string) (*discoveryv3.DiscoveryResponse, error) {
	t.Helper()
	return secretv3.NewSecretDiscoveryServiceClient(dialSDSUnix(t, socket)).FetchSecrets(t.Context(), &discoveryv3.DiscoveryRequest{
		Node: &corev3.Node{Id: "envoy"}, TypeUrl: resourcev3.SecretType, ResourceNames: names,
	})
}
