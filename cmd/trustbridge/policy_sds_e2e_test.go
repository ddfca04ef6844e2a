package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/sds"
)

const (
	westOpsToken = "west-ops-bootstrap-token-0123456789"
	partnerName  = "spiffe://east.example"
)

var westOps = spiffeid.RequireFromString("spiffe://west.example/ns/ops/sa/batch")

// The trust policy reaches Envoy through the whole server: west's
// --trust-policy grants east.example to ns/default only, and only its
// peer ns/default/sa/api. The web workload's ALL carries east with that
// peer as a URI SAN matcher; the ops workload's ALL has no east, its
// spiffe://east.example is the explicit denial, and its node agent relays
// exactly that. Granting ops in the file reaches its stream with no
// restart.
func TestSDSE2ETrustPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a federated pair and an agent")
	}
	tokens := servertest.WriteTokenFile(t, westToken+","+westWorkload.String()+",reusable\n"+westOpsToken+","+westOps.String()+",reusable\n")
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(workloads string) {
		require.NoError(t, os.WriteFile(policy, []byte(`rules:
- name: default-to-east
  workloads: [`+workloads+`]
  trustDomains:
  - name: east.example
    peers: [spiffe://east.example/ns/default/sa/api]
`), 0o600))
	}
	write("{spiffeID: spiffe://west.example/ns/default/*}")
	_, west := startSPIFFEPair(t, nil, func(o *server.Config) {
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
		o.Policy.File, o.Policy.Poll = policy, 50*time.Millisecond
	})
	waitFederated(t, west, "east.example", 1, 30*time.Second)
	westRoots := caRootsOf(t, west)
	conn := dialSDSTLS(t, servertest.GRPCAddr(t, west.banner), west.td, westRoots, westToken)
	web := openEnvoy(t, conn, nil, sds.AllName, partnerName)
	r := web.recv(10 * time.Second)
	got := secrets(t, r)
	names, _ := spiffeValidator(t, got[sds.AllName])
	assert.Equal(t, []string{"east.example", "west.example"}, names)
	assert.ElementsMatch(t, []string{"exact:spiffe://east.example/ns/default/sa/api", "prefix:spiffe://west.example/"}, sans(got[sds.AllName]))
	assert.Equal(t, []string{"exact:spiffe://east.example/ns/default/sa/api"}, sans(got[partnerName]))
	web.ack(r)

	opsConn := dialSDSTLS(t, servertest.GRPCAddr(t, west.banner), west.td, westRoots, westOpsToken)
	ops := openEnvoy(t, opsConn, nil, sds.AllName, partnerName)
	r = ops.recv(10 * time.Second)
	got = secrets(t, r)
	names, _ = spiffeValidator(t, got[sds.AllName])
	assert.Equal(t, []string{"west.example"}, names, "ops may not trust east")
	assertDenied(t, got[partnerName])
	ops.ack(r)

	ao := agentFor(t, servertest.GRPCAddr(t, west.banner), cli.CertsPEM(westRoots), westOpsToken)
	startAgent(t, ao)
	relayed := openEnvoy(t, dialSDSUnix(t, ao.Socket), nil, sds.AllName, partnerName)
	ar := relayed.recv(10 * time.Second)
	agot := secrets(t, ar)
	names, _ = spiffeValidator(t, agot[sds.AllName])
	assert.Equal(t, []string{"west.example"}, names, "the agent relays the server's decision")
	// The server never sent this workload east's roots, so its agent does
	// not know east exists: it answers nothing for it, as for any trust
	// domain it does not know (a trust domain withdrawn later is denied
	// explicitly: sds/agent's TestRelayPolicy).
	assert.NotContains(t, agot, partnerName)
	relayed.ack(ar)

	write("{spiffeID: spiffe://west.example/ns/default/*}, {spiffeID: spiffe://west.example/ns/ops/sa/batch}")
	r = ops.recv(30 * time.Second)
	got = secrets(t, r)
	names, _ = spiffeValidator(t, got[sds.AllName])
	assert.Equal(t, []string{"east.example", "west.example"}, names, "the edit reached the ops stream")
	assert.Equal(t, []string{"exact:spiffe://east.example/ns/default/sa/api"}, sans(got[partnerName]))
}

// sans lists a validation context's URI SAN matchers as kind:value.
func sans(s *tlsv3.Secret) []string {
	var out []string
	for _, m := range s.GetValidationContext().GetMatchTypedSubjectAltNames() {
		if e := m.GetMatcher().GetExact(); e != "" {
			out = append(out, "exact:"+e)
		}
		if p := m.GetMatcher().GetPrefix(); p != "" {
			out = append(out, "prefix:"+p)
		}
	}
	return out
}

// assertDenied checks s is the explicit denial: one sentinel CA, a SAN
// matcher nothing can satisfy, and none of the partner's roots.
func assertDenied(t *testing.T, s *tlsv3.Secret) {
	t.Helper()
	require.NotNil(t, s, "a denied trust domain is answered")
	roots := trustedCA(t, s)
	require.Len(t, roots, 1)
	assert.Contains(t, roots[0].Subject.CommonName, sds.DeniedSubjectPrefix)
	assert.Equal(t, []string{"exact:" + sds.DeniedSAN}, sans(s))
}
