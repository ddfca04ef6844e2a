package agent

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/sds"
	"github.com/trustbridge/trustbridge/sds/attest"
)

// nodeAgent is an SDS server on a unix socket that attests each caller,
// maps its facts with rules, and serves it its own identity from an
// identity cache fed by the real certificate service.
type nodeAgent struct {
	cs     *certService
	socket string
}

func startNodeAgent(t *testing.T, rules []identitymap.Rule, allow ...spiffeid.ID) *nodeAgent {
	t.Helper()
	cs := newCertService(t, allow...)
	cache, err := NewIdentityCache(IdentityCacheConfig{Fetcher: cs.fetcher(t), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	startServing(t, cache.Run)
	attestor, err := attest.New(attest.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: tdA, Default: identitymap.DefaultNone}, rules)
	require.NoError(t, err)
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{x509bundle.FromX509Authorities(tdA, cs.authority.Bundle().X509Authorities())}))
	srv, err := sds.New(sds.Config{
		TrustDomain: tdA, Trust: trust, Credentials: cache.CredentialSource(),
		Authenticator: &AttestedAuthenticator{Attestor: attestor, Map: identitymap.NewCell(m), NodeName: "node-a"},
		Registerer:    prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", socket)
	require.NoError(t, err)
	gs := grpc.NewServer(grpc.Creds(attestor.Credentials()))
	secretv3.RegisterSecretDiscoveryServiceServer(gs, srv)
	startServing(t, func(ctx context.Context) error {
		go func() { <-ctx.Done(); gs.Stop() }()
		return gs.Serve(ln)
	})
	return &nodeAgent{cs: cs, socket: socket}
}

// fetchDefault asks for "default" as Envoy does, from this process.
func (a *nodeAgent) fetchDefault(t *testing.T) (*x509.Certificate, error) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+a.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := secretv3.NewSecretDiscoveryServiceClient(conn).FetchSecrets(t.Context(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{"default"}})
	if err != nil {
		return nil, err
	}
	require.Len(t, resp.GetResources(), 1)
	var secret tlsv3.Secret
	require.NoError(t, resp.GetResources()[0].UnmarshalTo(&secret))
	chain, err := caclient.ParsePEMCerts(secret.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	require.NoError(t, err)
	return chain[0], nil
}

// A process on the node is attested over the socket (the kernel's pid,
// uid and gid, pinned), its facts select a rule, and it is served the
// certificate of the identity that rule grants, which the agent obtained
// from the real certificate service by impersonation, with a key that
// never left the agent.
func TestNodeAgentServesTheCallersOwnIdentity(t *testing.T) {
	uid := uint32(os.Getuid())
	hostID := spiffeid.RequireFromString(fmt.Sprintf("spiffe://a.test/host/uid-%d", uid))
	a := startNodeAgent(t, []identitymap.Rule{{
		Name: "this-test", Origin: "test", Workloads: []identitymap.Selector{{UID: &uid}},
		SPIFFEID: "spiffe://{{.TrustDomain}}/host/uid-{{.UID}}",
	}}, hostID)
	leaf, err := a.fetchDefault(t)
	require.NoError(t, err)
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, hostID.String(), leaf.URIs[0].String())
	assert.Equal(t, []string{nodeID.String() + " -> " + hostID.String()}, a.cs.imp.questions(),
		"the agent asked for exactly the identity attestation gave, as the node")
}

// A process no rule selects gets nothing, with the reason; the server is
// never asked.
func TestNodeAgentRefusesAnUnmappedProcess(t *testing.T) {
	other := uint32(os.Getuid()) + 4242
	a := startNodeAgent(t, []identitymap.Rule{{
		Name: "someone-else", Origin: "test", Workloads: []identitymap.Selector{{UID: &other}},
		SPIFFEID: "spiffe://{{.TrustDomain}}/host/uid-{{.UID}}",
	}})
	_, err := a.fetchDefault(t)
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "someone-else", "the reason names the rules considered")
	assert.Empty(t, a.cs.imp.questions())
}

// A stream asks its credential source again at every re-authentication
// (every minute on a node): it keeps one hold on its identity, not one
// per ask, and gives it back when it ends.
func TestCredentialSourceHoldsOncePerStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestCache(t, IdentityCacheConfig{Fetcher: newFakeFetcher(t, time.Hour), Rand: fixedRand(0.5)})
		startServing(t, c.Run)
		src := c.CredentialSource()
		refs := func() int {
			c.mu.Lock()
			defer c.mu.Unlock()
			if e := c.entries[IdentityRequest{ID: webID}.key()]; e != nil {
				return e.refs
			}
			return -1
		}
		ctx, end := context.WithCancel(t.Context())
		for range 5 {
			_, err := src.Credential(ctx, webID)
			require.NoError(t, err)
		}
		assert.Equal(t, 1, refs(), "one hold for the stream")
		_, err := src.Credential(ctx, apiID)
		require.NoError(t, err)
		assert.Equal(t, 0, refs(), "a stream now proving another identity gives the first back")
		end()
		synctest.Wait()
		c.mu.Lock()
		assert.Equal(t, 0, c.entries[IdentityRequest{ID: apiID}.key()].refs, "released when the stream ends")
		c.mu.Unlock()

		_, err = src.Credential(context.Background(), webID)
		assert.ErrorContains(t, err, "outside a stream or call")
	})
}
