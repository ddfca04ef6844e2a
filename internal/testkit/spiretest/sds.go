package spiretest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// EnvoyNode is the node the kit's SDS client announces: Envoy 1.36. SPIRE
// serves the SPIFFE validator only to Envoy 1.18 and later (or to a node
// that names no version), so the version is part of what is compared.
func EnvoyNode() *corev3.Node {
	return &corev3.Node{
		Id:            "sidecar~127.0.0.1~spiretest~default.svc.cluster.local",
		Cluster:       "spiretest",
		UserAgentName: "envoy",
		UserAgentVersionType: &corev3.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corev3.BuildVersion{
			Version: &typev3.SemanticVersion{MajorNumber: 1, MinorNumber: 36},
		}},
	}
}

// SDSClient dials an SDS server's unix socket the way Envoy does (no TLS:
// the server identifies the caller by its peer credentials). The
// connection is closed at the end of the test.
func SDSClient(t testing.TB, socket string) secretv3.SecretDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///sds",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return secretv3.NewSecretDiscoveryServiceClient(conn)
}

// sdsTimeout bounds every SDS call the kit makes.
const sdsTimeout = 30 * time.Second

// StreamSecrets asks c for names on a new stream, as Envoy does, and
// returns the first response, decoded.
func StreamSecrets(t testing.TB, c secretv3.SecretDiscoveryServiceClient, names ...string) *SDSResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sdsTimeout)
	defer cancel()
	s, err := c.StreamSecrets(ctx)
	if err != nil {
		t.Fatalf("spiretest: StreamSecrets %q: %v", names, err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: EnvoyNode(), TypeUrl: resourcev3.SecretType, ResourceNames: names}); err != nil {
		t.Fatalf("spiretest: StreamSecrets %q: %v", names, err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatalf("spiretest: StreamSecrets %q: %v", names, err)
	}
	return mustDecode(t, resp)
}

// FetchSecrets asks c for names in one FetchSecrets call and returns the
// response, decoded.
func FetchSecrets(t testing.TB, c secretv3.SecretDiscoveryServiceClient, names ...string) *SDSResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sdsTimeout)
	defer cancel()
	resp, err := c.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{Node: EnvoyNode(), TypeUrl: resourcev3.SecretType, ResourceNames: names})
	if err != nil {
		t.Fatalf("spiretest: FetchSecrets %q: %v", names, err)
	}
	return mustDecode(t, resp)
}

func mustDecode(t testing.TB, resp *discoveryv3.DiscoveryResponse) *SDSResponse {
	t.Helper()
	d, err := DecodeSDS(resp)
	if err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	return d
}

// SDS is an SDS client on the agent's socket.
func (a *Agent) SDS(t testing.TB) secretv3.SecretDiscoveryServiceClient {
	t.Helper()
	return SDSClient(t, a.socket)
}

// WaitSynced returns once the agent serves e to the calling process: an
// X509-SVID for e's SPIFFE ID and a bundle for every trust domain e
// federates with. It watches a wildcard SDS stream, on which SPIRE pushes
// every change to the caller's identities; the agent learns of new
// entries at its next sync (AgentConfig.SyncInterval).
func (a *Agent) WaitSynced(t testing.TB, e Entry) {
	t.Helper()
	want := []string{e.SPIFFEID}
	for _, td := range e.FederatesWith {
		want = append(want, resourceNameOf(td))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := waitForResources(ctx, a.SDS(t), want); err != nil {
		t.Fatalf("spiretest: agent never served %q to this process: %v", want, err)
	}
}

// waitForResources reads a wildcard stream, acknowledging each response
// as Envoy does, until one holds every name in want.
func waitForResources(ctx context.Context, c secretv3.SecretDiscoveryServiceClient, want []string) error {
	s, err := c.StreamSecrets(ctx)
	if err != nil {
		return err
	}
	req := &discoveryv3.DiscoveryRequest{Node: EnvoyNode(), TypeUrl: resourcev3.SecretType}
	var last []string
	for {
		if err := s.Send(req); err != nil {
			return err
		}
		resp, err := s.Recv()
		if err != nil {
			return fmt.Errorf("%w (last served %q)", err, last)
		}
		d, err := DecodeSDS(resp)
		if err != nil {
			return err
		}
		last = d.Names()
		if containsAll(last, want) {
			return nil
		}
		req = &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// The SDS resource names Istio's agent has Envoy ask for: its X509-SVID
// and the roots it validates peers with.
const (
	DefaultSVIDName = "default"
	RootCAName      = "ROOTCA"
)

// EnvoySecrets asks c for each name on a stream of its own, as Envoy
// subscribes to each SDS secret, and returns the decoded first responses
// by name: for a comparison of two SDS servers, e.g.
// EnvoySecrets(t, c, DefaultSVIDName, RootCAName).
func EnvoySecrets(t testing.TB, c secretv3.SecretDiscoveryServiceClient, names ...string) map[string]*SDSResponse {
	t.Helper()
	out := make(map[string]*SDSResponse, len(names))
	for _, n := range names {
		out[n] = StreamSecrets(t, c, n)
	}
	return out
}
