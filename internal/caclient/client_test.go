package caclient

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

const testToken = "token-0123456789"

// fakeCA is a certificate service that knows one token (for laptopID) and
// accepts X509-SVIDs of its CA; it signs the CSR's key for the caller's
// identity.
type fakeCA struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	ca   *testca.CA
	addr string
	// gotTTL is the last validity asked for.
	gotTTL int64
}

func startFakeCA(t *testing.T) *fakeCA {
	t.Helper()
	f := &fakeCA{ca: testca.New(t, "example.org")}
	leaf, key := f.ca.Issue(t, spiffeid.RequireFromPath(exampleTD, ServerPath))
	serving := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{*serving},
		ClientAuth:   tls.RequestClientCert,
	})))
	securityv1alpha1.RegisterIstioCertificateServiceServer(gs, f)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.addr = ln.Addr().String()
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return f
}

func (f *fakeCA) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	var id spiffeid.ID
	md, _ := metadata.FromIncomingContext(ctx)
	if auth := md.Get("authorization"); len(auth) == 1 {
		if auth[0] != "Bearer "+testToken {
			return nil, status.Error(codes.Unauthenticated, "unknown token")
		}
		id = laptopID
	} else if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			var err error
			if id, _, err = x509svid.Verify(ti.State.PeerCertificates, x509bundle.FromX509Authorities(exampleTD, []*x509.Certificate{f.ca.Cert})); err != nil {
				return nil, status.Error(codes.Unauthenticated, err.Error())
			}
		}
	}
	if id.IsZero() {
		return nil, status.Error(codes.Unauthenticated, "no credentials")
	}
	b, _ := pem.Decode([]byte(req.GetCsr()))
	if b == nil {
		return nil, status.Error(codes.InvalidArgument, "no CSR")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if len(csr.URIs) > 0 && csr.URIs[0].String() != id.String() {
		return nil, status.Error(codes.PermissionDenied, "not your identity")
	}
	f.gotTTL = req.GetValidityDuration()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		URIs:         []*url.URL{id.URL()},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}, f.ca.Cert, csr.PublicKey, f.ca.Key)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: []string{
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(EncodeCerts([]*x509.Certificate{f.ca.Cert})),
	}}, nil
}

func TestCreateCertificate(t *testing.T) {
	f := startFakeCA(t)
	serverID := spiffeid.RequireFromPath(exampleTD, ServerPath)
	roots := []*x509.Certificate{f.ca.Cert}
	issuedLeaf, issuedKey := f.ca.Issue(t, laptopID)
	clientCert := &tls.Certificate{Certificate: [][]byte{issuedLeaf.Raw}, PrivateKey: issuedKey}
	otherCA := testca.New(t, "example.org")
	foreignLeaf, foreignKey := otherCA.Issue(t, laptopID)
	foreignCert := &tls.Certificate{Certificate: [][]byte{foreignLeaf.Raw}, PrivateKey: foreignKey}

	tests := []struct {
		name     string
		roots    []*x509.Certificate
		cert     *tls.Certificate
		req      Request
		code     codes.Code
		wantErr  string
		wantTTL  int64
		noServer bool
	}{
		{name: "token", roots: roots, req: Request{Token: testToken, TTL: 2 * time.Hour}, wantTTL: 7200},
		{name: "token and ID", roots: roots, req: Request{Token: testToken, ID: laptopID}},
		{name: "client certificate", roots: roots, cert: clientCert},
		{name: "unknown token", roots: roots, req: Request{Token: "nope-0123456789"}, code: codes.Unauthenticated},
		{name: "certificate of another CA", roots: roots, cert: foreignCert, code: codes.Unauthenticated},
		{name: "no credentials", roots: roots, code: codes.Unauthenticated},
		{name: "identity not ours", roots: roots, req: Request{Token: testToken, ID: spiffeid.RequireFromString("spiffe://example.org/admin")}, code: codes.PermissionDenied},
		{name: "server not in the roots", roots: []*x509.Certificate{otherCA.Cert}, req: Request{Token: testToken}, code: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := testca.NewKey(t, testca.ECP256)
			tt.req.Key = key
			chain, err := CreateCertificate(t.Context(), f.addr, ServerTLS(tt.roots, serverID, tt.cert), tt.req)
			if tt.code != codes.OK {
				assert.Equal(t, tt.code, status.Code(err), "%v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantTTL, f.gotTTL)
			id, err := CheckIssued(chain, key, exampleTD, tt.req.ID, []*x509.Certificate{f.ca.Cert})
			require.NoError(t, err)
			assert.Equal(t, laptopID, id)
			assert.Len(t, LeafChain(chain), 1)
		})
	}
}

// A token is never sent over a connection without TLS.
func TestBearerTokenRequiresTLS(t *testing.T) {
	assert.True(t, BearerToken("x").RequireTransportSecurity())
	md, err := BearerToken("abc").GetRequestMetadata(t.Context())
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"authorization": "Bearer abc"}, md)
}

func TestCreateCertificateNoKey(t *testing.T) {
	_, err := CreateCertificate(t.Context(), "127.0.0.1:1", &tls.Config{MinVersion: tls.VersionTLS12}, Request{})
	assert.ErrorContains(t, err, "caclient: no key")
}

func TestCheckIssued(t *testing.T) {
	issuer := testca.New(t, "example.org")
	other := testca.New(t, "example.org")
	fed := testca.New(t, "other.example")
	inter := testca.New(t, "example.org", testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	// An intermediate signed by issuer.
	interCert := testca.Sign(t, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: inter.Cert.Subject, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		URIs: []*url.URL{exampleTD.ID().URL()},
	}, issuer.Cert, inter.Key.Public(), issuer.Key)
	key := testca.NewKey(t, testca.ECP256)
	leaf, _ := issuer.Issue(t, laptopID, testca.Options{Key: key})
	viaInter := testca.Sign(t, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		URIs: []*url.URL{laptopID.URL()}, KeyUsage: x509.KeyUsageDigitalSignature,
	}, interCert, key.Public(), inter.Key)
	otherLeaf, _ := other.Issue(t, laptopID, testca.Options{Key: key})
	admin := spiffeid.RequireFromString("spiffe://example.org/admin")

	local := []*x509.Certificate{issuer.Cert}
	tests := []struct {
		name      string
		chain     []*x509.Certificate
		local     []*x509.Certificate
		key       crypto.Signer
		want      spiffeid.ID
		leafChain int
		err       string
	}{
		{name: "leaf and root", chain: []*x509.Certificate{leaf, issuer.Cert}, local: local, leafChain: 1},
		{name: "merged roots after the local", chain: []*x509.Certificate{leaf, issuer.Cert, fed.Cert}, local: local, leafChain: 1},
		{name: "no roots in the answer", chain: []*x509.Certificate{leaf}, local: local, leafChain: 1},
		{name: "intermediate", chain: []*x509.Certificate{viaInter, interCert, issuer.Cert}, local: local, leafChain: 2},
		{name: "asked for and got", chain: []*x509.Certificate{leaf, issuer.Cert}, local: local, want: laptopID, leafChain: 1},
		{name: "another identity", chain: []*x509.Certificate{leaf, issuer.Cert}, local: local, want: admin, err: "issued spiffe://example.org/vm/laptop, asked for spiffe://example.org/admin"},
		{name: "no local roots", chain: []*x509.Certificate{leaf, issuer.Cert}, err: "no roots of example.org"},
		{name: "empty", local: local, err: "no certificates"},
		{name: "another key", chain: []*x509.Certificate{leaf, issuer.Cert}, local: local, key: testca.NewKey(t, testca.ECP256), err: "not for the key"},
		{name: "root not the issuer", chain: []*x509.Certificate{otherLeaf, issuer.Cert}, local: local, err: "x509svid"},
		// The roots appended to the answer vouch for nothing: only the
		// local roots the caller holds do.
		{name: "issuer only in the answer", chain: []*x509.Certificate{otherLeaf, other.Cert}, local: local, err: "x509svid"},
		{name: "only a federated root held", chain: []*x509.Certificate{leaf, issuer.Cert}, local: []*x509.Certificate{fed.Cert}, err: "x509svid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := key
			if tt.key != nil {
				k = tt.key
			}
			id, err := CheckIssued(tt.chain, k, exampleTD, tt.want, tt.local)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, laptopID, id)
			assert.Len(t, LeafChain(tt.chain), tt.leafChain)
		})
	}
}

func TestCheckIssuedAtTime(t *testing.T) {
	issuer := testca.New(t, "example.org")
	key := testca.NewKey(t, testca.ECP256)
	leaf, _ := issuer.Issue(t, laptopID, testca.Options{Key: key})
	_, err := CheckIssued([]*x509.Certificate{leaf, issuer.Cert}, key, exampleTD, laptopID, []*x509.Certificate{issuer.Cert}, x509svid.WithTime(leaf.NotAfter.Add(time.Second)))
	assert.ErrorContains(t, err, "expired")
}

func TestIsSelfSigned(t *testing.T) {
	issuer := testca.New(t, "example.org")
	leaf, _ := issuer.Issue(t, laptopID)
	assert.True(t, IsSelfSigned(issuer.Cert))
	assert.False(t, IsSelfSigned(leaf))
	notCA := testca.New(t, "example.org", testca.Options{Mutate: func(c *x509.Certificate) { c.IsCA = false }})
	assert.False(t, IsSelfSigned(notCA.Cert))
}

// A certificate service of another trust domain than the one expected is
// a setup error no retry mends: refused as such, not as an unreachable
// server (Unavailable) that callers retry for ever. The agent judges
// roots naming trust domains at start; roots naming none leave it to
// this handshake.
func TestCreateCertificateServerOfAnotherTrustDomain(t *testing.T) {
	f := startFakeCA(t) // serves spiffe://example.org/trustbridge/ca
	want := spiffeid.RequireFromString("spiffe://other.org/trustbridge/ca")
	_, err := CreateCertificate(t.Context(), f.addr, ServerTLS([]*x509.Certificate{f.ca.Cert}, want, nil),
		Request{Token: testToken, Key: testca.NewKey(t, testca.ECP256)})
	require.ErrorIs(t, err, ErrServerTrustDomain)
	assert.Equal(t, codes.Unknown, status.Code(err), "not a gRPC status a caller retries")
	assert.EqualError(t, err, "certificate service of another trust domain: the server presents spiffe://example.org/trustbridge/ca, "+
		"an identity of example.org, not of other.org: point this client at other.org's certificate service, "+
		"or give it example.org's roots and trust domain")
}
