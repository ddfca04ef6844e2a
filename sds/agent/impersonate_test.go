package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

var (
	nodeID = spiffeid.RequireFromString("spiffe://a.test/ns/kube-system/sa/trustbridge-agent")
	webID  = spiffeid.RequireFromString("spiffe://a.test/ns/shop/sa/web")
	apiID  = spiffeid.RequireFromString("spiffe://a.test/ns/shop/sa/api")
	dbID   = spiffeid.RequireFromString("spiffe://a.test/ns/data/sa/db")
)

const nodeToken = "node-token-0123456789"

// recordingImpersonator authorizes the node for the targets in allow,
// and records every question, as nodeauth would be asked (which needs
// Kubernetes).
type recordingImpersonator struct {
	allow map[spiffeid.ID]bool
	mu    sync.Mutex
	asked []string // "caller -> target"
}

func (r *recordingImpersonator) AuthorizeImpersonation(_ context.Context, caller authn.Identity, target spiffeid.ID) error {
	r.mu.Lock()
	r.asked = append(r.asked, caller.ID.String()+" -> "+target.String())
	allowed := r.allow[target]
	r.mu.Unlock()
	if caller.ID == nodeID && allowed {
		return nil
	}
	return errors.New("no pod of this service account runs on the caller's node")
}

// permit lets the node have id from now on, as a pod of it scheduled to
// the node would.
func (r *recordingImpersonator) permit(id spiffeid.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allow[id] = true
}

func (r *recordingImpersonator) questions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.asked...)
}

// certService is trustbridge's real certificate service on loopback,
// backed by a real CA, with node tokens as TokenReview would prove them.
type certService struct {
	authority *ca.Authority
	imp       *recordingImpersonator
	addr      string
	// local is the local roots the server's SDS hands out (ROOTCA).
	local *sds.TrustCell
}

func newCertService(t *testing.T, allow ...spiffeid.ID) *certService {
	t.Helper()
	return newCertServiceWith(t, nil, allow...)
}

// newCertServiceWith is newCertService with cfg changed by with (its
// bundles and trust policy, say) before the service is built.
func newCertServiceWith(t testing.TB, with func(*certservice.Config, *ca.Authority), allow ...spiffeid.ID) *certService {
	t.Helper()
	return newCertServiceServing(t, with, nil, allow...)
}

// newCertServiceServing is newCertServiceWith whose gRPC server has opts
// too (an interceptor recording the calls, say).
func newCertServiceServing(t testing.TB, with func(*certservice.Config, *ca.Authority), opts []grpc.ServerOption, allow ...spiffeid.ID) *certService {
	t.Helper()
	authority, err := ca.New(ca.Config{TrustDomain: tdA, DataDir: t.TempDir()})
	require.NoError(t, err)
	imp := &recordingImpersonator{allow: map[spiffeid.ID]bool{}}
	for _, id := range allow {
		imp.allow[id] = true
	}
	tokens := authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
		if r.BearerToken != nodeToken {
			return authn.Identity{}, fmt.Errorf("unknown token: %w", authn.ErrInvalidCredentials)
		}
		return authn.Identity{ID: nodeID, Method: authn.MethodKubernetesJWT,
			Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "kube-system/trustbridge-agent", UID: "uid-agent"}}, nil
	})
	cfg := certservice.Config{
		Signer:        authority,
		Authenticator: tokens,
		Impersonator:  imp,
		Registerer:    prometheus.NewRegistry(),
	}
	if with != nil {
		with(&cfg, authority)
	}
	svc, err := certservice.New(cfg)
	require.NoError(t, err)
	sc, err := authority.ServingCert(serverID, time.Hour)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := certservice.NewServer(svc, certservice.TLSConfig(sc.GetCertificate), ln, opts...)
	// The server's own SDS beside it, as trustbridge serves it, for the
	// Rotator's first trust: the local roots, to the callers the
	// certificate service authenticates (with may have changed them).
	local := sds.NewTrustCell()
	require.NoError(t, local.Set([]*x509bundle.Bundle{authority.Bundle().X509Bundle()}))
	svids := authn.NewX509SVID(tdA, authority.Bundle().X509Bundle(), clock.RealClock{})
	serverSDS, err := sds.New(sds.Config{TrustDomain: tdA, Trust: local, Authenticator: authn.Chain{cfg.Authenticator, svids}, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	serverSDS.Register(srv.Registrar())
	startServing(t, srv.Run)
	return &certService{authority: authority, imp: imp, addr: ln.Addr().String(), local: local}
}

// startServing runs run until the test ends.
func startServing(t testing.TB, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// node is the node agent's credentials for s: its token, the CA's roots.
func (s *certService) node() (NodeCredentials, error) {
	return NodeCredentials{Token: nodeToken, Roots: s.authority.Bundle().X509Authorities(), ServerID: serverID}, nil
}

func (s *certService) fetcher(t *testing.T) *ImpersonationFetcher {
	t.Helper()
	f, err := NewImpersonationFetcher(ImpersonationConfig{CAAddr: s.addr, Node: s.node})
	require.NoError(t, err)
	return f
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

// The real certificate service grants the node the identities of its
// workloads, one certificate each, for the agent's own keys; the server's
// node authorizer is asked for each, with the node as the caller.
func TestImpersonationFetcherRealService(t *testing.T) {
	s := newCertService(t, webID, apiID)
	f := s.fetcher(t)

	keys := map[spiffeid.ID]*ecdsa.PrivateKey{webID: newKey(t), apiID: newKey(t)}
	leaves := map[spiffeid.ID]*x509.Certificate{}
	for id, key := range keys {
		chain, err := f.FetchX509SVID(t.Context(), id, key)
		require.NoError(t, err, "%s", id)
		require.NotEmpty(t, chain)
		got, _, err := x509svid.Verify(chain, s.authority.Bundle().X509Bundle())
		require.NoError(t, err)
		assert.Equal(t, id, got)
		assert.True(t, key.PublicKey.Equal(chain[0].PublicKey), "the leaf is for the agent's key")
		for _, c := range chain {
			assert.False(t, c.IsCA && c.CheckSignatureFrom(c) == nil, "no root in the chain to present")
		}
		leaves[id] = chain[0]
	}
	assert.False(t, leaves[webID].PublicKey.(*ecdsa.PublicKey).Equal(leaves[apiID].PublicKey), "two identities, two keys")
	assert.NotEqual(t, leaves[webID].SerialNumber, leaves[apiID].SerialNumber)
	assert.ElementsMatch(t, []string{nodeID.String() + " -> " + webID.String(), nodeID.String() + " -> " + apiID.String()}, s.imp.questions())
}

// An identity the server's authorizer refuses: the refusal reaches the
// caller as PermissionDenied with the server's reason, through the fetcher
// and through the cache, which keeps no certificate and answers the next
// asks from memory for refusalMemory (TestIdentityCacheRemembersRefusals),
// so a process reconnecting in a loop does not become a request per
// connection.
func TestImpersonationRefused(t *testing.T) {
	s := newCertService(t, webID)
	f := s.fetcher(t)

	_, err := f.FetchX509SVID(t.Context(), dbID, newKey(t))
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "may not have a certificate for "+dbID.String())
	assert.ErrorContains(t, err, "no pod of this service account runs on the caller's node")

	reg := prometheus.NewRegistry()
	c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Registerer: reg})
	startServing(t, c.Run)
	for range 2 {
		_, err = c.Acquire(t.Context(), dbID)
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, dbID.String())
		assert.Equal(t, 0.0, testutil.ToFloat64(c.metrics.entries), "nothing cached")
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.fetches.WithLabelValues("refused")), "the second answered from memory")

	// The cache end to end: a granted identity is served to its holder.
	h, err := c.Acquire(t.Context(), webID)
	require.NoError(t, err)
	defer h.Release()
	cred, err := h.Credential(t.Context(), webID)
	require.NoError(t, err)
	got, _, err := x509svid.Verify(cred.Chain, s.authority.Bundle().X509Bundle())
	require.NoError(t, err)
	assert.Equal(t, webID, got)
}

// A server that answers with a certificate other than the one asked for
// (another identity, another key, another CA, an expired one) is refused:
// the fetcher fails closed and the cache serves nothing.
func TestImpersonationFetcherRefusesWrongAnswer(t *testing.T) {
	caA, other := testca.New(t, tdA.Name()), testca.New(t, tdA.Name())
	for name, tt := range map[string]struct {
		answer func(t *testing.T, csr *x509.CertificateRequest) *x509.Certificate
		msg    string
	}{
		"another identity": {func(t *testing.T, csr *x509.CertificateRequest) *x509.Certificate {
			return issueFor(t, caA, apiID, csr.PublicKey, time.Now(), time.Hour)
		}, "issued " + apiID.String() + ", asked for " + webID.String()},
		"another key": {func(t *testing.T, _ *x509.CertificateRequest) *x509.Certificate {
			return issueFor(t, caA, webID, newKey(t).Public(), time.Now(), time.Hour)
		}, "not for the key"},
		"another CA": {func(t *testing.T, csr *x509.CertificateRequest) *x509.Certificate {
			return issueFor(t, other, webID, csr.PublicKey, time.Now(), time.Hour)
		}, "x509svid"},
	} {
		t.Run(name, func(t *testing.T) {
			addr := startFakeCertService(t, caA, tt.answer)
			f, err := NewImpersonationFetcher(ImpersonationConfig{CAAddr: addr, Node: func() (NodeCredentials, error) {
				return NodeCredentials{Token: nodeToken, Roots: []*x509.Certificate{caA.Cert}, ServerID: serverID}, nil
			}})
			require.NoError(t, err)
			_, err = f.FetchX509SVID(t.Context(), webID, newKey(t))
			require.ErrorIs(t, err, errUnusable)
			assert.ErrorContains(t, err, tt.msg)
			assert.Equal(t, "unusable", fetchResult(err))
		})
	}
}

// startFakeCertService serves, as serverID signed by ca, a certificate
// service that signs whatever answer makes of the request's CSR after
// checking the impersonation field names webID.
func startFakeCertService(t *testing.T, ca *testca.CA, answer func(*testing.T, *x509.CertificateRequest) *x509.Certificate) string {
	t.Helper()
	leaf, key := ca.Issue(t, serverID)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}},
		MinVersion:   tls.VersionTLS12,
	})))
	securityv1alpha1.RegisterIstioCertificateServiceServer(gs, &fakeCertService{t: t, ca: ca, answer: answer})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

type fakeCertService struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	t      *testing.T
	ca     *testca.CA
	answer func(*testing.T, *x509.CertificateRequest) *x509.Certificate
	calls  atomic.Int32
}

func (f *fakeCertService) CreateCertificate(_ context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	f.calls.Add(1)
	if got := req.GetMetadata().GetFields()[caclient.ImpersonatedIdentity].GetStringValue(); got != webID.String() {
		return nil, status.Errorf(codes.InvalidArgument, "impersonating %q", got)
	}
	b, _ := pem.Decode([]byte(req.GetCsr()))
	if b == nil {
		return nil, status.Error(codes.InvalidArgument, "no CSR")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	leaf := f.answer(f.t, csr)
	return &securityv1alpha1.IstioCertificateResponse{CertChain: []string{string(pemCerts(leaf)), string(pemCerts(f.ca.Cert))}}, nil
}

// The Rotator lends the node's credentials: its token when it has a token
// file (the one proof the server grants impersonation to), else its
// current certificate while valid; nothing before Init.
func TestRotatorNodeCredentials(t *testing.T) {
	caA := testca.New(t, tdA.Name())
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(nodeToken+"\n"), 0o600))
	leaf, key := caA.Issue(t, nodeID)
	cur := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}

	newRot := func(tokenFile string) *Rotator {
		r, err := NewRotator(RotatorConfig{CAAddr: "127.0.0.1:1", Roots: []*x509.Certificate{caA.Cert}, ServerID: serverID,
			TokenFile: tokenFile, OutputCertsDir: t.TempDir()})
		require.NoError(t, err)
		return r
	}
	r := newRot(tokenFile)
	_, err := r.NodeCredentials()
	assert.ErrorContains(t, err, "before a successful Init")

	r.cur = cur
	nc, err := r.NodeCredentials()
	require.NoError(t, err)
	assert.Equal(t, nodeToken, nc.Token)
	assert.Nil(t, nc.Certificate)
	assert.Equal(t, serverID, nc.ServerID)
	assert.Equal(t, []*x509.Certificate{caA.Cert}, nc.Roots)

	r = newRot("")
	r.cur = cur
	nc, err = r.NodeCredentials()
	require.NoError(t, err)
	assert.Empty(t, nc.Token)
	assert.Same(t, cur, nc.Certificate)

	r.clock = clocktesting.NewFakeClock(leaf.NotAfter)
	_, err = r.NodeCredentials()
	assert.ErrorIs(t, err, errNoAuth)
	assert.True(t, strings.Contains(err.Error(), "expired"), "%v", err)
}
