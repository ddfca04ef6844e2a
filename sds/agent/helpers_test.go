package agent

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/svidcheck"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

func TestMain(m *testing.M) {
	if code, ok := childMain(); ok {
		os.Exit(code)
	}
	goleak.VerifyTestMain(kubetest.Tests(m))
}

var (
	tdA      = spiffeid.RequireTrustDomainFromString("a.test")
	tdB      = spiffeid.RequireTrustDomainFromString("b.test")
	tdC      = spiffeid.RequireTrustDomainFromString("c.test")
	workload = spiffeid.RequireFromString("spiffe://a.test/ns/default/sa/web")
	serverID = spiffeid.RequireFromString("spiffe://a.test/trustbridge/ca")
)

func pemCerts(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

func pemKey(t testing.TB, k crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// writeCreds writes a credential set for id issued by ca into dir, as `ca
// request` does: the roots of id's trust domain in root-cert.pem, the
// others (by the trust domain their URI SAN names) in bundle.spiffe.json,
// which is removed when there are none. It returns the leaf.
func writeCreds(t *testing.T, dir string, ca *testca.CA, id spiffeid.ID, roots ...*x509.Certificate) *x509.Certificate {
	t.Helper()
	leaf, key := ca.Issue(t, id)
	var local []*x509.Certificate
	peers := map[spiffeid.TrustDomain][]*x509.Certificate{}
	for _, r := range roots {
		td, ok := svidcheck.RootTrustDomain(r)
		require.True(t, ok, "test roots name their trust domain")
		if td == id.TrustDomain() {
			local = append(local, r)
		} else {
			peers[td] = append(peers[td], r)
		}
	}
	writeFile(t, filepath.Join(dir, CertChainFile), pemCerts(leaf))
	writeFile(t, filepath.Join(dir, KeyFile), pemKey(t, key))
	writeFile(t, filepath.Join(dir, RootCertFile), pemCerts(local...))
	if len(peers) == 0 {
		require.NoError(t, os.RemoveAll(filepath.Join(dir, BundleMapFile)))
	} else {
		writeFile(t, filepath.Join(dir, BundleMapFile), bundleMapOf(t, peers))
	}
	return leaf
}

// writeFile replaces path atomically, as a Secret volume update does.
func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, data, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// shortDir is a temporary directory with a short path: unix socket paths
// are limited to about 100 bytes.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ag")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// socketClient dials the SDS socket like Envoy.
func socketClient(t *testing.T, path string) secretv3.SecretDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///sds",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return secretv3.NewSecretDiscoveryServiceClient(conn)
}

func secretsOf(t *testing.T, resp *discoveryv3.DiscoveryResponse) map[string]*tlsv3.Secret {
	t.Helper()
	out := make(map[string]*tlsv3.Secret)
	for _, a := range resp.GetResources() {
		var s tlsv3.Secret
		require.NoError(t, anypb.UnmarshalTo(a, &s, proto.UnmarshalOptions{}))
		out[s.GetName()] = &s
	}
	return out
}

// leafOf returns the leaf certificate of a tls_certificate secret.
func leafOf(t *testing.T, s *tlsv3.Secret) *x509.Certificate {
	t.Helper()
	require.NotNil(t, s.GetTlsCertificate(), "secret %q", s.GetName())
	certs, err := pemfile.ParseCertificates(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	require.NoError(t, err)
	return certs[0]
}

// trustDomainsOf returns the trust domains of an ALL secret.
func trustDomainsOf(t *testing.T, s *tlsv3.Secret) []string {
	t.Helper()
	byTD, err := parseSPIFFEValidator(s.GetValidationContext())
	require.NoError(t, err)
	var out []string
	for td := range byTD {
		out = append(out, td.Name())
	}
	slices.Sort(out)
	return out
}

// stream opens a SotW stream on the socket for names.
type sotw = grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]

func openStream(t *testing.T, c secretv3.SecretDiscoveryServiceClient, names ...string) (sotw, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.StreamSecrets(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Send(&discoveryv3.DiscoveryRequest{
		Node: &corev3.Node{Id: "envoy"}, TypeUrl: resourcev3.SecretType, ResourceNames: names,
	}))
	return s, cancel
}

// recvWithin receives one response or fails after d.
func recvWithin(t *testing.T, s sotw, d time.Duration) *discoveryv3.DiscoveryResponse {
	t.Helper()
	type res struct {
		r   *discoveryv3.DiscoveryResponse
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := s.Recv()
		ch <- res{r, err}
	}()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		return r.r
	case <-time.After(d):
		t.Fatalf("no SDS response within %s", d)
		return nil
	}
}

// ack acknowledges resp on s for names.
func ack(t *testing.T, s sotw, resp *discoveryv3.DiscoveryResponse, names ...string) {
	t.Helper()
	require.NoError(t, s.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.SecretType, ResourceNames: names,
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
	}))
}

// collect receives on s, acknowledging, until every name has been seen and
// done accepts the latest secrets.
func collect(t *testing.T, s sotw, done func(map[string]*tlsv3.Secret) bool, names ...string) map[string]*tlsv3.Secret {
	t.Helper()
	got := make(map[string]*tlsv3.Secret)
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp := recvWithin(t, s, time.Until(deadline))
		for k, v := range secretsOf(t, resp) {
			got[k] = v
		}
		ack(t, s, resp, names...)
		if done(got) {
			return got
		}
	}
}

func hasAll(names ...string) func(map[string]*tlsv3.Secret) bool {
	return func(m map[string]*tlsv3.Secret) bool {
		for _, n := range names {
			if m[n] == nil {
				return false
			}
		}
		return true
	}
}

// runAgent runs a in the background; the returned function stops it and
// returns Run's error. done delivers that error once, to whoever watches
// for Run ending early; stop returns it all the same.
func runAgent(t testing.TB, a *Agent) (stop func() error, done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	finished := make(chan struct{})
	var err error
	go func() {
		err = a.Run(ctx)
		close(finished)
		ch <- err
	}()
	stop = func() error {
		cancel()
		<-finished
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop, ch
}

// waitSocket waits until the agent listens on path or Run ended.
func waitSocket(t testing.TB, path string, done <-chan error) {
	t.Helper()
	waitUnlessEnded(t, done, func() bool {
		fi, err := os.Lstat(path)
		return err == nil && fi.Mode().Type() == os.ModeSocket
	})
}

// waitUnlessEnded waits until cond holds, failing the test at once if Run
// ends first (done delivers) and after 5s otherwise. cond runs on another
// goroutine, so the test fails here, on its own.
func waitUnlessEnded(t testing.TB, done <-chan error, cond func() bool) {
	t.Helper()
	var ended atomic.Pointer[error]
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			ended.Store(&err)
			return true
		default:
		}
		return cond()
	}, 5*time.Second, 5*time.Millisecond)
	if err := ended.Load(); err != nil {
		t.Fatalf("Run ended: %v", *err)
	}
}

func newTestAgent(t testing.TB, cfg Config) *Agent {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	a, err := New(cfg)
	require.NoError(t, err)
	a.probeTimeout = 300 * time.Millisecond
	a.retry = loop.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: retryJitter}
	return a
}

// upstream is a trustbridge server's SDS on 127.0.0.1 with mTLS, as the
// relay talks to it.
type upstream struct {
	ca    *testca.CA
	trust *sds.TrustCell
	addr  string
	gs    *grpc.Server
	tls   *tls.Config
}

func newUpstream(t *testing.T, ca *testca.CA, trust *sds.TrustCell, addr string) *upstream {
	t.Helper()
	return newUpstreamWith(t, ca, trust, addr, nil)
}

// newUpstreamWith is newUpstream with a trust policy.
func newUpstreamWith(t *testing.T, ca *testca.CA, trust *sds.TrustCell, addr string, policy sds.AccessPolicy) *upstream {
	t.Helper()
	leaf, key := ca.Issue(t, serverID)
	bundle := x509bundle.FromX509Authorities(ca.TrustDomain, []*x509.Certificate{ca.Cert})
	srv, err := sds.New(sds.Config{
		TrustDomain:   ca.TrustDomain,
		Trust:         trust,
		Authenticator: authn.NewX509SVID(ca.TrustDomain, bundle, nil),
		Policy:        policy,
	})
	require.NoError(t, err)
	u := &upstream{ca: ca, trust: trust}
	u.tls = upstreamTLS(leaf, key)
	u.gs = grpc.NewServer(grpc.Creds(credentials.NewTLS(u.tls)))
	srv.Register(u.gs)
	u.start(t, addr)
	return u
}

// upstreamTLS is the server side of the relay's mTLS; the client
// certificate is verified by the SDS server's authenticator.
func upstreamTLS(leaf *x509.Certificate, key crypto.Signer) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}},
		ClientAuth:   tls.RequestClientCert,
		MinVersion:   tls.VersionTLS12,
	}
}

func (u *upstream) start(t *testing.T, addr string) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	u.addr = ln.Addr().String()
	gs := u.gs
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
}

// fakeRotator stands in for *Rotator: a fixed credential and the client
// TLS a Rotator builds (mTLS, the server's SVID verified).
type fakeRotator struct {
	id   spiffeid.ID
	cell *sds.CredentialCell
	svid *x509svid.SVID
	ca   *testca.CA

	mu          sync.Mutex
	serverRoots []*x509.Certificate
	rootsSet    chan struct{}
}

func newFakeRotator(t *testing.T, ca *testca.CA, id spiffeid.ID) *fakeRotator {
	t.Helper()
	leaf, key := ca.Issue(t, id)
	return &fakeRotator{
		id: id, cell: sds.NewCredentialCell(id), ca: ca,
		svid:     &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{leaf}, PrivateKey: key},
		rootsSet: make(chan struct{}, 16),
	}
}

func (f *fakeRotator) Init(context.Context) error {
	return f.cell.Set(f.svid.Certificates, f.svid.PrivateKey)
}
func (f *fakeRotator) Cell() *sds.CredentialCell { return f.cell }
func (f *fakeRotator) ID() spiffeid.ID           { return f.id }
func (f *fakeRotator) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (f *fakeRotator) ClientTLS() *tls.Config {
	bundle := x509bundle.FromX509Authorities(f.ca.TrustDomain, []*x509.Certificate{f.ca.Cert})
	return tlsconfig.MTLSClientConfig(f.svid, bundle, tlsconfig.AuthorizeID(serverID))
}

func (f *fakeRotator) Trust() caclient.Trust {
	return caclient.Trust{TrustDomain: f.ca.TrustDomain, Local: []*x509.Certificate{f.ca.Cert}}
}

func (f *fakeRotator) SetServerRoots(roots []*x509.Certificate) {
	f.mu.Lock()
	f.serverRoots = roots
	f.mu.Unlock()
	select {
	case f.rootsSet <- struct{}{}:
	default:
	}
}

// caAgent is an agent in the CA branch with a fake rotator.
func caAgent(t *testing.T, socket string, rot *fakeRotator, caAddr string, reg prometheus.Registerer) *Agent {
	t.Helper()
	a := newTestAgent(t, Config{SocketPath: socket, CredentialsDir: filepath.Join(filepath.Dir(socket), "none"), Registerer: reg})
	a.rot = rot
	a.caAddr = caAddr
	return a
}
