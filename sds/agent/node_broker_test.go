//go:build linux

package agent

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	"github.com/spiffe/go-spiffe/v2/spiffegrpc/grpccredentials"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds/attest"
	"github.com/trustbridge/trustbridge/sds/broker"
)

var ztunnelID = spiffeid.RequireFromString("spiffe://a.test/ns/istio-system/sa/ztunnel")

// webPod is the one pod fakePods knows, which brokerMap gives webID.
var webPod = attest.KubernetesFacts{PodUID: "0e3c5a8e-6f0a-4f57-9d1c-3c8f1f4b2a11", Namespace: "shop", PodName: "web-1", ServiceAccount: "web"}

// fakePods is this node's pods for Pod references: webPod only.
type fakePods struct{}

func (fakePods) LookupPod(_ context.Context, ref attest.PodRef) (attest.KubernetesFacts, error) {
	byName := ref.Name != "" && (ref.Namespace != webPod.Namespace || ref.Name != webPod.PodName)
	if byName || (ref.UID != "" && ref.UID != webPod.PodUID) || (ref.Name == "" && ref.UID == "") {
		return attest.KubernetesFacts{}, fmt.Errorf("%w: %s", attest.ErrUnknownPod, ref)
	}
	return webPod, nil
}

func (fakePods) ChangedPod(string) <-chan struct{} { return nil }

func (fakePods) ChangedAccount(string, string) <-chan struct{} { return nil }

func (fakePods) PodsOf(string, string) ([]attest.KubernetesFacts, error) { return nil, nil }

// brokerMap gives webPod webID and, with host, this process (by its uid)
// ztunnel's identity.
func brokerMap(t *testing.T, host bool) *identitymap.Map {
	t.Helper()
	rules := []identitymap.Rule{{Name: "web", Origin: "test",
		Workloads: []identitymap.Selector{{Namespace: webPod.Namespace, ServiceAccount: webPod.ServiceAccount}}, SPIFFEID: webID.String()}}
	if host {
		uid := uint32(os.Getuid())
		rules = append(rules, identitymap.Rule{Name: "ztunnel", Origin: "test",
			Workloads: []identitymap.Selector{{UID: &uid}}, SPIFFEID: ztunnelID.String()})
	}
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: tdA, Default: identitymap.DefaultNone}, rules)
	require.NoError(t, err)
	return m
}

// subscribeWeb asks the broker socket for web's X509-SVID by pod
// reference over creds and returns the first answer.
func subscribeWeb(ctx context.Context, socket string, creds credentials.TransportCredentials) (*brokerpb.SubscribeToX509SVIDResponse, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ref, err := brokerCall{Namespace: webPod.Namespace, Pod: webPod.PodName}.reference()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, broker.Header, "true"))
	defer cancel()
	s, err := brokerpb.NewAPIClient(conn).SubscribeToX509SVID(ctx, &brokerpb.SubscribeToX509SVIDRequest{Reference: ref})
	if err != nil {
		return nil, err
	}
	return s.Recv()
}

// One broker socket, both transports: a broker with its X509-SVID from
// the node's Workload API connects with mutual TLS, authorising the
// agent's own SPIFFE ID, and is allowed by the spiffe:// rule its
// certificate matches; a plaintext caller is allowed by the identity the
// map gives it, and refused once the map gives it none, with or without
// its certificate. A certificate for another ID than the process attests
// as is refused; one of another trust domain fails the handshake.
func TestNodeBrokerMTLS(t *testing.T) {
	policy, err := broker.ParsePolicy([]string{ztunnelID.String()})
	require.NoError(t, err)
	sock := filepath.Join(shortDir(t), "broker.sock")
	f := startNodeFixtureWith(t, func(cfg *Config) {
		cfg.Node.Broker = &BrokerConfig{Socket: sock, Policy: policy, Pods: fakePods{}}
	}, ztunnelID, ztunnelID, webID)
	f.ids.Set(brokerMap(t, true))
	waitSocket(t, sock, f.done)
	waitSocket(t, f.wl, f.done)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// The broker's SVID and bundle, as ztunnel gets them.
	c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(f.wl)))
	require.NoError(t, err)
	x, err := c.FetchX509Context(ctx)
	require.NoError(t, c.Close())
	require.NoError(t, err)
	require.Len(t, x.SVIDs, 1)
	require.Equal(t, ztunnelID, x.SVIDs[0].ID)
	mtls := grpccredentials.MTLSClientCredentials(x.SVIDs[0], x.Bundles, tlsconfig.AuthorizeID(nodeID))

	resp, err := subscribeWeb(ctx, sock, mtls)
	require.NoError(t, err)
	require.Len(t, resp.GetSvids(), 1)
	assert.Equal(t, webID.String(), resp.GetSvids()[0].GetSpiffeId())

	resp, err = subscribeWeb(ctx, sock, insecure.NewCredentials())
	require.NoError(t, err, "plaintext: the identity map's ztunnel ID")
	assert.Equal(t, webID.String(), resp.GetSvids()[0].GetSpiffeId())

	// web's certificate, from this process, which attests as ztunnel: a
	// certificate does not replace attestation.
	key := testca.NewKey(t, testca.ECP256)
	issued, err := f.cs.authority.SignX509SVID(ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: webID})
	require.NoError(t, err)
	webSVID := &x509svid.SVID{ID: webID, Certificates: issued.Chain[:len(issued.Chain)-len(issued.Roots)], PrivateKey: key}
	_, err = subscribeWeb(ctx, sock, grpccredentials.MTLSClientCredentials(webSVID, x.Bundles, tlsconfig.AuthorizeID(nodeID)))
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "presents a certificate for "+webID.String()+" but attests as "+ztunnelID.String())

	// b.test is federated, but brokers are of a.test only.
	bID := spiffeid.RequireFromString("spiffe://b.test/ns/istio-system/sa/ztunnel")
	leaf, bKey := f.b.Issue(t, bID)
	stranger := &x509svid.SVID{ID: bID, Certificates: []*x509.Certificate{leaf}, PrivateKey: bKey}
	_, err = subscribeWeb(ctx, sock, grpccredentials.MTLSClientCredentials(stranger, x.Bundles, tlsconfig.AuthorizeID(nodeID)))
	assert.Equal(t, codes.Unavailable, status.Code(err), "the handshake fails: %v", err)

	// The map no longer gives this process an identity.
	f.ids.Set(brokerMap(t, false))
	_, err = subscribeWeb(ctx, sock, insecure.NewCredentials())
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "matches none of the broker rules")
	_, err = subscribeWeb(ctx, sock, mtls)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "the certificate alone does not vouch: %v", err)
	assert.Contains(t, status.Convert(err).Message(), "presents a certificate for "+ztunnelID.String()+" but attests as no identity")
}

// The broker socket's TLS sources read the agent's current credential at
// each handshake (a renewal needs no restart), and its local roots: the
// Rotator's while the node's workload trust holds none.
func TestBrokerTLSSources(t *testing.T) {
	caA := testca.New(t, tdA.Name())
	rot := newFakeRotator(t, caA, nodeID)
	require.NoError(t, rot.Init(t.Context()))
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	nt, err := newNodeTrust(tdA, nil, nil, clock.RealClock{}, slog.New(slog.DiscardHandler), m)
	require.NoError(t, err)

	svids := rotatorSVID{rot}
	got, err := svids.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, nodeID, got.ID)
	assert.Equal(t, rot.svid.Certificates[0].Raw, got.Certificates[0].Raw)
	leaf, key := caA.Issue(t, nodeID)
	require.NoError(t, rot.cell.Set([]*x509.Certificate{leaf}, key))
	got, err = svids.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, leaf.Raw, got.Certificates[0].Raw, "renewed")

	roots := localRoots{trust: nt, rot: rot}
	b, err := roots.GetX509BundleForTrustDomain(tdA)
	require.NoError(t, err)
	assert.True(t, b.HasX509Authority(caA.Cert))
	_, err = roots.GetX509BundleForTrustDomain(tdB)
	assert.ErrorContains(t, err, "brokers of trust domain a.test only")
}
