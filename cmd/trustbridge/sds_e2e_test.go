package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/sds"
)

// envoy plays Envoy on one SDS stream, built on go-control-plane's client
// stubs.
type envoy struct {
	t      *testing.T
	stream secretv3.SecretDiscoveryService_StreamSecretsClient
	resps  chan *discoveryv3.DiscoveryResponse
	errs   chan error
	node   *corev3.Node
	names  []string
}

// dialSDSTLS connects to a server's gRPC listener as a client of its
// trust domain: the server must present spiffe://<td>/trustbridge/ca
// chaining to roots; token, when set, is sent as a bearer token.
func dialSDSTLS(t *testing.T, addr string, td spiffeid.TrustDomain, roots []*x509.Certificate, token string) *grpc.ClientConn {
	t.Helper()
	store := trust.NewStore()
	store.Set("bootstrap", spiffebundle.FromX509Authorities(td, roots))
	cfg := trust.ClientTLSConfig(nil, &trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, server.GRPCServingPath))})
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(cli.BearerToken(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// dialSDSUnix connects to an agent's unix socket as Envoy does.
func dialSDSUnix(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// openEnvoy opens a StreamSecrets stream and subscribes to names.
func openEnvoy(t *testing.T, conn *grpc.ClientConn, meta map[string]any, names ...string) *envoy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	require.NoError(t, err)
	node := &corev3.Node{Id: "sidecar~10.0.0.1~test~default.svc.cluster.local", Cluster: "test"}
	if meta != nil {
		md, err := structpb.NewStruct(meta)
		require.NoError(t, err)
		node.Metadata = md
	}
	e := &envoy{t: t, stream: stream, resps: make(chan *discoveryv3.DiscoveryResponse, 16), errs: make(chan error, 1), node: node, names: names}
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				e.errs <- err
				return
			}
			e.resps <- r
		}
	}()
	// io.EOF means the server already ended the stream; Recv tells why.
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.SecretType, ResourceNames: names}); err != io.EOF {
		require.NoError(t, err)
	}
	return e
}

// recv waits for the next response.
func (e *envoy) recv(timeout time.Duration) *discoveryv3.DiscoveryResponse {
	e.t.Helper()
	select {
	case r := <-e.resps:
		return r
	case err := <-e.errs:
		e.t.Fatalf("SDS stream ended: %v", err)
	case <-time.After(timeout):
		e.t.Fatalf("no SDS response within %s", timeout)
	}
	return nil
}

// ack acknowledges r.
func (e *envoy) ack(r *discoveryv3.DiscoveryResponse) {
	e.t.Helper()
	require.NoError(e.t, e.stream.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.SecretType, ResourceNames: e.names, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce(),
	}))
}

// secrets decodes a response's resources by name.
func secrets(t *testing.T, r *discoveryv3.DiscoveryResponse) map[string]*tlsv3.Secret {
	t.Helper()
	out := map[string]*tlsv3.Secret{}
	for _, a := range r.GetResources() {
		var s tlsv3.Secret
		require.NoError(t, a.UnmarshalTo(&s))
		out[s.GetName()] = &s
	}
	return out
}

// spiffeValidator returns the trust domains and roots of an ALL secret's
// SPIFFECertValidatorConfig, in the order sent.
func spiffeValidator(t *testing.T, s *tlsv3.Secret) (names []string, roots map[string][]*x509.Certificate) {
	t.Helper()
	cv := s.GetValidationContext().GetCustomValidatorConfig()
	require.NotNil(t, cv, "ALL carries a custom validator")
	assert.Equal(t, sds.SPIFFEValidatorName, cv.GetName())
	var cfg tlsv3.SPIFFECertValidatorConfig
	require.NoError(t, cv.GetTypedConfig().UnmarshalTo(&cfg))
	roots = map[string][]*x509.Certificate{}
	for _, d := range cfg.GetTrustDomains() {
		names = append(names, d.GetName())
		certs, err := cli.ParsePEMCerts(d.GetTrustBundle().GetInlineBytes())
		require.NoError(t, err)
		roots[d.GetName()] = certs
	}
	return names, roots
}

// trustedCA parses a validation context's trusted_ca.
func trustedCA(t *testing.T, s *tlsv3.Secret) []*x509.Certificate {
	t.Helper()
	certs, err := cli.ParsePEMCerts(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
	require.NoError(t, err)
	return certs
}

// workloadCert checks a tls_certificate's chain and key belong together
// and verify as an X509-SVID against roots, and returns the identity.
func workloadCert(t *testing.T, s *tlsv3.Secret, td spiffeid.TrustDomain, roots []*x509.Certificate) (spiffeid.ID, *x509.Certificate) {
	t.Helper()
	tc := s.GetTlsCertificate()
	require.NotNil(t, tc, "%s is a tls_certificate", s.GetName())
	pair, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	require.NoError(t, err, "chain and key match")
	var chain []*x509.Certificate
	for _, der := range pair.Certificate {
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		chain = append(chain, c)
	}
	id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(td, roots))
	require.NoError(t, err)
	return id, chain[0]
}

func sameCerts(t *testing.T, want, got []*x509.Certificate, msg string) {
	t.Helper()
	key := func(cs []*x509.Certificate) []string {
		out := make([]string, len(cs))
		for i, c := range cs {
			out[i] = string(c.Raw)
		}
		sort.Strings(out)
		return out
	}
	assert.Equal(t, key(want), key(got), msg)
}

const westToken = "west-bootstrap-token-0123456789"

var westWorkload = spiffeid.RequireFromString("spiffe://west.example/ns/default/sa/web")

// watchAuthorities reports when s's /v1/federation first shows n
// authorities for td: the moment the server's trust store took the
// bundle, give or take one 10ms poll.
func watchAuthorities(t *testing.T, s *e2eServer, td string, n int) <-chan time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	seen := make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if st, ok := federationStatus(t, s, td); ok && len(x509Held(st.Authorities)) >= n {
				seen <- time.Now()
				return
			}
		}
	}()
	return seen
}

// waitForRoots reads e's responses, ACKing each, until the validation
// context name holds n roots, and returns that response and when it came.
func waitForRoots(t *testing.T, e *envoy, name string, n int, timeout time.Duration) (map[string]*tlsv3.Secret, time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := e.recv(time.Until(deadline))
		at := time.Now()
		e.ack(r)
		got := secrets(t, r)
		if s, ok := got[name]; ok && len(trustedCA(t, s)) >= n {
			return got, at
		}
	}
}

// TestSDSE2EFederatedRotation runs two real servers federated over
// https_spiffe and plays Envoy against west's SDS: its own certificate,
// ROOTCA, ALL and spiffe://east.example, then sees east's new root pushed
// as soon as west's trust store takes it.
func TestSDSE2EFederatedRotation(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the server's CA recheck (up to 30s)")
	}
	// Envoy authenticates its SDS stream with the token itself, which
	// needs a reusable one (a stream mints for as long as it lasts).
	tokens := servertest.WriteTokenFile(t, westToken+","+westWorkload.String()+",reusable\n")
	east, west := startSPIFFEPair(t,
		func(o *server.Config) { o.RefreshHint = 2 * time.Second },
		func(o *server.Config) {
			o.Federation.MinRefresh = time.Second
			o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
		})
	waitFederated(t, west, "east.example", 1, 30*time.Second)
	westRoots, eastRoots := caRootsOf(t, west), caRootsOf(t, east)

	conn := dialSDSTLS(t, servertest.GRPCAddr(t, west.banner), west.td, westRoots, westToken)
	e := openEnvoy(t, conn, nil, sds.DefaultName, sds.RootCAName, sds.AllName, "spiffe://east.example")
	r := e.recv(10 * time.Second)
	got := secrets(t, r)
	require.Len(t, got, 4, "every subscribed name is sent")
	id, _ := workloadCert(t, got[sds.DefaultName], west.td, westRoots)
	assert.Equal(t, westWorkload, id, "the certificate is for the identity the token proves")
	sameCerts(t, westRoots, trustedCA(t, got[sds.RootCAName]), "ROOTCA is west's roots")
	sameCerts(t, eastRoots, trustedCA(t, got["spiffe://east.example"]), "spiffe://east.example is east's roots only")
	names, roots := spiffeValidator(t, got[sds.AllName])
	assert.Equal(t, []string{"east.example", "west.example"}, names)
	sameCerts(t, eastRoots, roots["east.example"], "ALL: east")
	sameCerts(t, westRoots, roots["west.example"], "ALL: west")
	e.ack(r)

	// Old Envoys without the SPIFFE validator get every root as trusted_ca.
	plain := openEnvoy(t, conn, map[string]any{sds.DisableSPIFFEValidationKey: true}, sds.AllName)
	pr := plain.recv(10 * time.Second)
	sameCerts(t, append(append([]*x509.Certificate{}, eastRoots...), westRoots...), trustedCA(t, secrets(t, pr)[sds.AllName]), "plain ALL")
	plain.ack(pr)

	// West's node agent relays the same trust from west's SDS stream.
	westPEM := cli.CertsPEM(westRoots)
	ao := agentFor(t, servertest.GRPCAddr(t, west.banner), westPEM, westToken)
	startAgent(t, ao)
	ae := openEnvoy(t, dialSDSUnix(t, ao.Socket), nil, sds.DefaultName, sds.RootCAName, sds.AllName, "spiffe://east.example")
	ar := ae.recv(10 * time.Second)
	agot := secrets(t, ar)
	require.Len(t, agot, 4)
	id, _ = workloadCert(t, agot[sds.DefaultName], west.td, westRoots)
	assert.Equal(t, westWorkload, id)
	sameCerts(t, westRoots, trustedCA(t, agot[sds.RootCAName]), "agent: ROOTCA")
	sameCerts(t, eastRoots, trustedCA(t, agot["spiffe://east.example"]), "agent: east")
	names, _ = spiffeValidator(t, agot[sds.AllName])
	assert.Equal(t, []string{"east.example", "west.example"}, names)
	ae.ack(ar)

	seen := watchAuthorities(t, west, "east.example", 2)
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", east.dataDir)
	require.Equal(t, 0, code, stderr)

	got, pushed := waitForRoots(t, e, "spiffe://east.example", 2, 90*time.Second)
	var stored time.Time
	select {
	case stored = <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("west's status never showed east's new root")
	}
	// The issue asks for "within a second"; the house rule forbids timing
	// thresholds in tests, so the latency is logged (tens of ms here) and
	// the mechanism is what is tested: sds has no timer between a trust
	// store change and a push (sds' own tests drive it with channels).
	t.Logf("pushed %s after west's status showed east's new root", pushed.Sub(stored).Round(time.Millisecond))
	agot, relayed := waitForRoots(t, ae, "spiffe://east.example", 2, 10*time.Second)
	t.Logf("the agent relayed it to Envoy %s after west's status showed it", relayed.Sub(stored).Round(time.Millisecond))
	newEast := caRootsOf(t, east)
	sameCerts(t, newEast, trustedCA(t, agot["spiffe://east.example"]), "agent: the new east roots")
	_, roots = spiffeValidator(t, agot[sds.AllName])
	sameCerts(t, newEast, roots["east.example"], "agent: ALL follows")
	require.Len(t, newEast, 2)
	sameCerts(t, newEast, trustedCA(t, got["spiffe://east.example"]), "the new east roots")
	_, roots = spiffeValidator(t, got[sds.AllName])
	sameCerts(t, newEast, roots["east.example"], "ALL follows")
}

// TestSDSRefusals checks the server's SDS on the real listener: a stream
// without credentials is refused, and an authenticated workload asking
// for another workload's certificate is refused without it being minted.
func TestSDSRefusals(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	td := servertest.LaptopID.TrustDomain()

	for _, tc := range []struct {
		name  string
		token string
		names []string
		want  codes.Code
	}{
		{"no credentials", "", []string{sds.RootCAName}, codes.Unauthenticated},
		{"unknown token", "not-a-known-bootstrap-token-0123", []string{sds.RootCAName}, codes.Unauthenticated},
		{"another workload's certificate", servertest.LaptopToken, []string{"spiffe://example.org/ns/prod/sa/payments"}, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := openEnvoy(t, dialSDSTLS(t, addr, td, roots, tc.token), nil, tc.names...)
			select {
			case r := <-e.resps:
				t.Fatalf("got a response: %v", r)
			case err := <-e.errs:
				assert.Equal(t, tc.want, status.Code(err), "%v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the stream was neither refused nor answered")
			}
		})
	}
}

// Envoy sends its node, with every extension it was built with and, under
// Istio, kilobytes of metadata, on a stream's first request: far more than
// the certificate service allows for a CSR, on the same listener.
func TestSDSLargeNode(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	td := servertest.LaptopID.TrustDomain()
	meta := map[string]any{}
	for i := range 400 {
		meta[fmt.Sprintf("ISTIO_META_LABEL_%03d", i)] = strings.Repeat("v", 1000)
	}
	e := openEnvoy(t, dialSDSTLS(t, addr, td, roots, servertest.LaptopToken), meta, sds.RootCAName)
	require.Greater(t, proto.Size(e.node), 4*certservice.MaxRecvMsgSize, "the node must exceed the certificate service's limit")
	got := secrets(t, e.recv(10*time.Second))
	require.Contains(t, got, sds.RootCAName)
	sameCerts(t, roots, trustedCA(t, got[sds.RootCAName]), "ROOTCA")
}
