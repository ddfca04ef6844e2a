package workload

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	tdA = spiffeid.RequireTrustDomainFromString("a.test")
	tdB = spiffeid.RequireTrustDomainFromString("b.test")
	tdC = spiffeid.RequireTrustDomainFromString("c.test")
	web = spiffeid.RequireFromString("spiffe://a.test/ns/default/sa/web")
)

// world is two federated trust domains, each with an X.509 CA and a JWT
// signing key.
type world struct {
	caA, caB   *testca.CA
	jwtA, jwtB crypto.Signer
}

const (
	kidA = "kid-a"
	kidB = "kid-b"
)

func newWorld(t testing.TB) *world {
	t.Helper()
	return &world{
		caA: testca.New(t, tdA.Name()), caB: testca.New(t, tdB.Name()),
		jwtA: testca.NewKey(t, testca.ECP256), jwtB: testca.NewKey(t, testca.ECP256),
	}
}

func (w *world) bundleA(t testing.TB) *spiffebundle.Bundle {
	t.Helper()
	b := w.caA.Bundle()
	require.NoError(t, b.AddJWTAuthority(kidA, w.jwtA.Public()))
	return b
}

func (w *world) bundleB(t testing.TB) *spiffebundle.Bundle {
	t.Helper()
	b := w.caB.Bundle()
	require.NoError(t, b.AddJWTAuthority(kidB, w.jwtB.Public()))
	return b
}

// svid issues a fresh X509-SVID for web.
func (w *world) svid(t testing.TB) *SVID {
	t.Helper()
	leaf, key := w.caA.Issue(t, web)
	return &SVID{ID: web, Chain: []*x509.Certificate{leaf}, Key: key}
}

// shortDir is a temporary directory with a short path: unix socket paths
// are limited to about 100 bytes.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "wl")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// serve runs a server for cfg on a unix socket and returns the address
// go-spiffe clients take ("unix:///abs/path").
func serve(t *testing.T, cfg Config) (addr string, reg *prometheus.Registry) {
	t.Helper()
	reg = prometheus.NewRegistry()
	cfg.Registerer = reg
	srv, err := New(cfg)
	require.NoError(t, err)
	path := filepath.Join(shortDir(t), "api.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return "unix://" + path, reg
}

// testcaRoot is a new root for td, as after the peer's root rotation.
func testcaRoot(t *testing.T, td spiffeid.TrustDomain) *x509.Certificate {
	t.Helper()
	return testca.New(t, td.Name()).Cert
}

func mustGauge(t *testing.T, reg *prometheus.Registry, method string) prometheus.Collector {
	t.Helper()
	return gatherOne(t, reg, "trustbridge_workload_api_streams", map[string]string{"method": method})
}

func mustRequests(t *testing.T, reg *prometheus.Registry, method string, code codes.Code) prometheus.Collector {
	t.Helper()
	return gatherOne(t, reg, "trustbridge_workload_api_requests_total", map[string]string{"method": method, "code": code.String()})
}

// gatherOne is the value of one series of reg as a collector testutil
// reads; 0 when the series does not exist.
func gatherOne(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m.GetLabel(), labels) {
				v = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "value"})
	g.Set(v)
	return g
}

func matches(pairs []*dto.LabelPair, want map[string]string) bool {
	n := 0
	for _, p := range pairs {
		if v, ok := want[p.GetName()]; ok {
			if v != p.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// rawClient is a Workload API client that sets no header by itself.
func rawClient(t *testing.T, addr string) workloadpb.SpiffeWorkloadAPIClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return workloadpb.NewSpiffeWorkloadAPIClient(conn)
}

// withHeader is ctx carrying the Workload API security header.
func withHeader(ctx context.Context) context.Context {
	return metadata.NewOutgoingContext(ctx, metadata.Pairs(Header, "true"))
}

// signer is a JWTMinter signing locally for id, five minutes valid.
type signer struct {
	key crypto.Signer
	kid string
	id  spiffeid.ID
}

func (s signer) MintJWTSVID(_ context.Context, audience []string) (string, error) {
	now := time.Now()
	return jwtsvid.Mint(s.key, s.kid, jwtsvid.Claims{Subject: s.id, Audience: audience, IssuedAt: now, Expiry: now.Add(5 * time.Minute)})
}

// syncBuffer is a log sink the server's goroutines write while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
