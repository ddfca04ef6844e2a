package main

import (
	"slices"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/sds"
)

// TestAgentRootCASPIFFEE2E plays an Istio sidecar, which asks its agent
// for default and ROOTCA only, against west's node agent run with
// --rootca spiffe: ROOTCA is the SPIFFE validator holding east and west,
// relayed from west's real server, the same as the agent's ALL, while
// spiffe://west.example stays west's roots alone.
func TestAgentRootCASPIFFEE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two federated servers")
	}
	tokens := servertest.WriteTokenFile(t, westToken+","+westWorkload.String()+",reusable\n")
	east, west := startSPIFFEPair(t, nil, func(o *server.Config) {
		o.Federation.MinRefresh = time.Second
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
	})
	waitFederated(t, west, "east.example", 1, 30*time.Second)
	westRoots, eastRoots := caRootsOf(t, west), caRootsOf(t, east)

	ao := agentFor(t, servertest.GRPCAddr(t, west.banner), cli.CertsPEM(westRoots), westToken)
	ao.RootCA = "spiffe"
	startAgent(t, ao)

	sidecar := openEnvoy(t, dialSDSUnix(t, ao.Socket), nil, sds.DefaultName, sds.RootCAName)
	got := sidecar.recvAcked(30*time.Second, func(got map[string]*tlsv3.Secret) bool {
		return got[sds.RootCAName] != nil && slices.Equal(validatorNames(t, got[sds.RootCAName]), []string{"east.example", "west.example"})
	})
	id, _ := workloadCert(t, got[sds.DefaultName], west.td, westRoots)
	assert.Equal(t, westWorkload, id)
	_, roots := spiffeValidator(t, got[sds.RootCAName])
	sameCerts(t, eastRoots, roots["east.example"], "ROOTCA: east")
	sameCerts(t, westRoots, roots["west.example"], "ROOTCA: west")

	gateway := openEnvoy(t, dialSDSUnix(t, ao.Socket), nil, sds.AllName, sds.RootCAName, "spiffe://west.example")
	both := gateway.recvAcked(30*time.Second, func(got map[string]*tlsv3.Secret) bool {
		return got[sds.AllName] != nil && got[sds.RootCAName] != nil && got["spiffe://west.example"] != nil
	})
	assert.True(t, proto.Equal(both[sds.AllName].GetValidationContext(), both[sds.RootCAName].GetValidationContext()), "ROOTCA is ALL")
	sameCerts(t, westRoots, trustedCA(t, both["spiffe://west.example"]), "spiffe://west.example: west's roots alone")
}

// validatorNames is the trust domains of a SPIFFE validator secret, nil
// for a plain trusted_ca.
func validatorNames(t *testing.T, s *tlsv3.Secret) []string {
	t.Helper()
	if s.GetValidationContext().GetCustomValidatorConfig() == nil {
		return nil
	}
	names, _ := spiffeValidator(t, s)
	return names
}
