package agent

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/prometheus/client_golang/prometheus"
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

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// agentCertService is IstioCertificateService issuing id to the holder of
// token, signed by ca.
type agentCertService struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	ca    *testca.CA
	token string
	id    spiffeid.ID
	calls atomic.Int32
}

func (f *agentCertService) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	f.calls.Add(1)
	if authn.FromGRPC(ctx).BearerToken != f.token {
		return nil, status.Error(codes.Unauthenticated, "bad token")
	}
	b, _ := pem.Decode([]byte(req.GetCsr()))
	if b == nil {
		return nil, status.Error(codes.InvalidArgument, "no CSR")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:                  []*url.URL{f.id.URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.ca.Cert, csr.PublicKey, f.ca.Key)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: []string{
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pemCerts(f.ca.Cert)),
	}}, nil
}

// TestRunCAWithRotator runs the CA branch end to end with the real
// Rotator: certificate service and SDS on one TLS port, as trustbridge's
// --grpc-listen serves them.
func TestRunCAWithRotator(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	caA, caB, caC := testca.New(t, tdA.Name()), testca.New(t, tdB.Name()), testca.New(t, tdC.Name())
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token"), 0o600))

	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA), bundleOf(caB)}))
	srv, err := sds.New(sds.Config{
		TrustDomain:   tdA,
		Trust:         trust,
		Authenticator: authn.NewX509SVID(tdA, bundleOf(caA), nil),
	})
	require.NoError(t, err)
	leaf, key := caA.Issue(t, serverID)
	u := &upstream{ca: caA, trust: trust, tls: upstreamTLS(leaf, key)}
	u.gs = grpc.NewServer(grpc.Creds(credentials.NewTLS(u.tls)))
	srv.Register(u.gs)
	certs := &agentCertService{ca: caA, token: "s3cret-token", id: workload}
	securityv1alpha1.RegisterIstioCertificateServiceServer(u.gs, certs)
	u.start(t, "")

	a := newTestAgent(t, Config{
		SocketPath:     sock,
		CredentialsDir: filepath.Join(dir, "creds"),
		Registerer:     prometheus.NewRegistry(),
		Rotator: &RotatorConfig{
			CAAddr:    u.addr,
			Roots:     []*x509.Certificate{caA.Cert},
			TokenFile: tokenFile,
		},
	})
	stop, done := runAgent(t, a)
	waitSocket(t, sock, done)

	names := []string{sds.DefaultName, sds.RootCAName, sds.AllName}
	s := mustStream(t, sock, names...)
	tds := func(want ...string) func(map[string]*tlsv3.Secret) bool {
		return func(m map[string]*tlsv3.Secret) bool {
			return hasAll(names...)(m) && assert.ObjectsAreEqual(want, trustDomainsOf(t, m[sds.AllName]))
		}
	}
	got := collect(t, s, tds("a.test", "b.test"), names...)
	id, err := x509svid.IDFromCert(leafOf(t, got[sds.DefaultName]))
	require.NoError(t, err)
	assert.Equal(t, workload, id)
	assert.EqualValues(t, 1, certs.calls.Load())

	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA), bundleOf(caC)}))
	collect(t, s, tds("a.test", "c.test"), names...)

	require.NoError(t, stop())
}

func TestNewRotatorConfigError(t *testing.T) {
	_, err := New(Config{Rotator: &RotatorConfig{CAAddr: "127.0.0.1:1"}})
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrAlreadyServing))
}

// When the credentials directory is also the Rotator's output directory,
// the files there are the Rotator's own: they are renewed through the
// CA, not served as pre-provisioned files (which would go stale).
func TestRunCAOwnsCredentialsDir(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	caA := testca.New(t, tdA.Name())
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token"), 0o600))
	creds := filepath.Join(dir, "creds")
	// Files from an earlier run, for another identity.
	old := spiffeid.RequireFromPath(tdA, "/earlier")
	writeIssued(t, creds, caA, old, testca.Options{})

	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA)}))
	srv, err := sds.New(sds.Config{TrustDomain: tdA, Trust: trust, Authenticator: authn.NewX509SVID(tdA, bundleOf(caA), nil)})
	require.NoError(t, err)
	leaf, key := caA.Issue(t, serverID)
	u := &upstream{ca: caA, trust: trust, tls: upstreamTLS(leaf, key)}
	u.gs = grpc.NewServer(grpc.Creds(credentials.NewTLS(u.tls)))
	srv.Register(u.gs)
	certs := &agentCertService{ca: caA, token: "s3cret-token", id: workload}
	securityv1alpha1.RegisterIstioCertificateServiceServer(u.gs, certs)
	u.start(t, "")

	require.FileExists(t, filepath.Join(creds, caclient.OwnerFile), "an earlier run marked the directory its own")

	a := newTestAgent(t, Config{
		SocketPath:     sock,
		CredentialsDir: creds + "/",
		Registerer:     prometheus.NewRegistry(),
		Rotator:        &RotatorConfig{CAAddr: u.addr, Roots: []*x509.Certificate{caA.Cert}, TokenFile: tokenFile, OutputCertsDir: creds},
	})
	stop, done := runAgent(t, a)
	waitSocket(t, sock, done)
	got := collect(t, mustStream(t, sock, sds.DefaultName), hasAll(sds.DefaultName), sds.DefaultName)
	id, err := x509svid.IDFromCert(leafOf(t, got[sds.DefaultName]))
	require.NoError(t, err)
	assert.Equal(t, workload, id, "the CA's certificate, not the file's")
	assert.Positive(t, certs.calls.Load())
	require.NoError(t, stop())
}

// With a CA, credentials another tool wrote in the credentials directory
// (no owner mark) are neither overwritten nor served: Run refuses, saying
// how to serve them or hand the directory over, and asks no CA. Named as
// the CA's output directory (OUTPUT_CERTS), the directory is adopted.
func TestRunCARefusesForeignCredentialsDir(t *testing.T) {
	dir := shortDir(t)
	caA := testca.New(t, tdA.Name())
	creds := filepath.Join(dir, "creds")
	writeIssued(t, creds, caA, spiffeid.RequireFromPath(tdA, "/csi"), testca.Options{})
	require.NoError(t, os.Remove(filepath.Join(creds, caclient.OwnerFile)))
	before, err := os.ReadFile(filepath.Join(creds, caclient.ChainFile))
	require.NoError(t, err)
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("t"), 0o600))

	for _, tc := range []struct {
		name  string
		adopt bool
	}{{"refused", false}, {"adopted", true}} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(dir, tc.name+".sock")
			a := newTestAgent(t, Config{
				SocketPath:          sock,
				CredentialsDir:      creds,
				AdoptCredentialsDir: tc.adopt,
				Rotator:             &RotatorConfig{CAAddr: "127.0.0.1:1", Roots: []*x509.Certificate{caA.Cert}, TokenFile: tokenFile, OutputCertsDir: creds},
			})
			if !tc.adopt {
				err := a.Run(context.Background())
				require.Error(t, err)
				assert.Contains(t, err.Error(), "cert-chain.pem, key.pem that trustbridge did not write")
				assert.Contains(t, err.Error(), "--file-mounted-certs")
				assert.Contains(t, err.Error(), "empty it")
				assert.NoFileExists(t, sock, "nothing served")
				after, err := os.ReadFile(filepath.Join(creds, caclient.ChainFile))
				require.NoError(t, err)
				assert.Equal(t, before, after, "the files are kept")
				return
			}
			// Adopted: the agent goes on to the CA (unreachable here) and
			// stops when told.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			assert.NoError(t, a.Run(ctx))
		})
	}
}
