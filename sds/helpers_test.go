package sds

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"sort"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
)

var (
	localTD  = spiffeid.RequireTrustDomainFromString("local.test")
	remoteTD = spiffeid.RequireTrustDomainFromString("remote.test")
	otherTD  = spiffeid.RequireTrustDomainFromString("other.test")
	idA      = spiffeid.RequireFromPath(localTD, "/ns/a/sa/a")
	idB      = spiffeid.RequireFromPath(localTD, "/ns/b/sa/b")
)

// testCA is a root CA for one trust domain, minted at run time.
type testCA struct {
	td    spiffeid.TrustDomain
	cert  *x509.Certificate
	key   crypto.Signer
	clock clock.PassiveClock

	mu    sync.Mutex
	signs int
}

func newTestCA(t testing.TB, td spiffeid.TrustDomain, clk clock.PassiveClock) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := clk.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: td.Name() + " root " + fmt.Sprint(now.UnixNano())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{td.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{td: td, cert: cert, key: key, clock: clk}
}

func (c *testCA) bundle() *x509bundle.Bundle {
	return x509bundle.FromX509Authorities(c.td, []*x509.Certificate{c.cert})
}

// Sign implements Signer.
func (c *testCA) Sign(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
	return c.SignWithDNSNames(pub, id, ttl, nil)
}

// SignWithDNSNames implements DNSSigner.
func (c *testCA) SignWithDNSNames(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration, dnsNames []string) ([]*x509.Certificate, error) {
	c.mu.Lock()
	c.signs++
	serial := int64(c.signs + 1)
	c.mu.Unlock()
	now := c.clock.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		NotBefore:    now,
		NotAfter:     now.Add(ttl),
		URIs:         []*url.URL{id.URL()},
		DNSNames:     dnsNames,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, pub, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return []*x509.Certificate{leaf}, nil
}

func (c *testCA) signCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.signs
}

// tokens is a test authenticator: bearer token → identity, revocable.
type tokens struct {
	mu          sync.Mutex
	ids         map[string]spiffeid.ID
	unavailable bool
	denied      bool // a valid token whose claims no issuer rule allows
}

func (k *tokens) revoke(tok string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.ids, tok)
}

func (k *tokens) Authenticate(_ context.Context, r authn.Request) (authn.Identity, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.unavailable {
		return authn.Identity{}, fmt.Errorf("test: %w", authn.ErrUnavailable)
	}
	if k.denied {
		return authn.Identity{}, fmt.Errorf("test: claim ref not allowed: %w", authn.ErrPermissionDenied)
	}
	if r.BearerToken == "" {
		return authn.Identity{}, fmt.Errorf("test: %w", authn.ErrNoCredentials)
	}
	id, ok := k.ids[r.BearerToken]
	if !ok {
		return authn.Identity{}, fmt.Errorf("test: %w", authn.ErrInvalidCredentials)
	}
	return authn.Identity{ID: id, Method: authn.MethodBootstrapToken}, nil
}

// env is a running SDS server on loopback with its sources.
type env struct {
	t      *testing.T
	clock  *clocktesting.FakeClock
	ca     *testCA
	remote *testCA
	trust  *TrustCell
	minter *Minter
	tokens *tokens
	reg    *prometheus.Registry
	server *Server
	addr   string
	// handled receives one value per request a stream has handled.
	handled chan struct{}
}

type envOption func(*Config)

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := &env{t: t, clock: clk, reg: prometheus.NewRegistry(), trust: NewTrustCell()}
	e.ca = newTestCA(t, localTD, clk)
	e.remote = newTestCA(t, remoteTD, clk)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.remote.bundle(), e.ca.bundle()}))
	var err error
	e.minter, err = NewMinter(MinterConfig{Signer: e.ca, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)
	e.tokens = &tokens{ids: map[string]spiffeid.ID{"token-a": idA, "token-b": idB,
		"token-foreign": spiffeid.RequireFromPath(remoteTD, "/w")}}
	cfg := Config{
		TrustDomain:   localTD,
		Trust:         e.trust,
		Credentials:   e.minter,
		Authenticator: e.tokens,
		Clock:         clk,
		Registerer:    e.reg,
	}
	for _, o := range opts {
		o(&cfg)
	}
	e.server, err = New(cfg)
	require.NoError(t, err)
	e.handled = make(chan struct{}, 1000)
	e.server.requestDone = func() {
		select {
		case e.handled <- struct{}{}:
		default:
		}
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	e.server.Register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	e.addr = lis.Addr().String()
	return e
}

// client dials its own connection, so that flow control of one client
// never touches another's.
func (e *env) client() secretv3.SecretDiscoveryServiceClient {
	e.t.Helper()
	cc, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = cc.Close() })
	return secretv3.NewSecretDiscoveryServiceClient(cc)
}

func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

type sotwClient = grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
type deltaClient = grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]

func (e *env) stream(tok string) sotwClient {
	e.t.Helper()
	ctx, cancel := context.WithCancel(withToken(context.Background(), tok))
	e.t.Cleanup(cancel)
	s, err := e.client().StreamSecrets(ctx)
	require.NoError(e.t, err)
	return s
}

func (e *env) delta(tok string) deltaClient {
	e.t.Helper()
	ctx, cancel := context.WithCancel(withToken(context.Background(), tok))
	e.t.Cleanup(cancel)
	s, err := e.client().DeltaSecrets(ctx)
	require.NoError(e.t, err)
	return s
}

func node(meta map[string]any) *corev3.Node {
	n := &corev3.Node{Id: "envoy-1", Cluster: "c"}
	if meta != nil {
		s, err := structpb.NewStruct(meta)
		if err != nil {
			panic(err)
		}
		n.Metadata = s
	}
	return n
}

// recv reads one response, failing the test on a stream error.
func recv(t *testing.T, s sotwClient) *discoveryv3.DiscoveryResponse {
	t.Helper()
	resp, err := s.Recv()
	require.NoError(t, err)
	return resp
}

// secrets decodes a response's resources by name.
func secrets(t *testing.T, anys []*anypb.Any) map[string]*tlsv3.Secret {
	t.Helper()
	out := make(map[string]*tlsv3.Secret)
	for _, a := range anys {
		s := &tlsv3.Secret{}
		require.NoError(t, a.UnmarshalTo(s))
		require.NotContains(t, out, s.GetName())
		out[s.GetName()] = s
	}
	return out
}

func secretsOf(t *testing.T, resp *discoveryv3.DiscoveryResponse) map[string]*tlsv3.Secret {
	t.Helper()
	return secrets(t, resp.GetResources())
}

// certsFromPEM parses every certificate in b.
func certsFromPEM(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		require.Equal(t, "CERTIFICATE", blk.Type)
		c, err := x509.ParseCertificate(blk.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
	return out
}

// keyPair checks a tls_certificate secret: the chain and key match.
func keyPair(t *testing.T, s *tlsv3.Secret) tls.Certificate {
	t.Helper()
	tc := s.GetTlsCertificate()
	require.NotNil(t, tc, "secret %q is not a tls_certificate", s.GetName())
	kp, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(kp.Certificate[0])
	require.NoError(t, err)
	kp.Leaf = leaf
	return kp
}

var errTest = errors.New("test failure")

func slicesSort(s []string) { sort.Strings(s) }

// waitHandled waits until the server has handled n more requests.
func (e *env) waitHandled(n int) {
	e.t.Helper()
	for range n {
		select {
		case <-e.handled:
		case <-time.After(10 * time.Second):
			e.t.Fatal("request not handled")
		}
	}
}

// send sends, leaving a stream the server ended to the next Recv.
func send[T any](t *testing.T, s interface{ Send(T) error }, m T) {
	t.Helper()
	if err := s.Send(m); err != nil && !errors.Is(err, io.EOF) {
		require.NoError(t, err)
	}
}
