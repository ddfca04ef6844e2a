package signbench

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// floorEnv makes TestFloorServerProcess serve: the floor targets run this
// test binary again, with it, as their server: floorCanned answers
// canned responses (grpc-floor), floorSigning signs (grpc-floor+signing).
const (
	floorEnv     = "SIGNBENCH_FLOOR_SERVER"
	floorCanned  = "1"
	floorSigning = "sign"
)

// floorListening starts the line on which the floor server tells its
// parent its address and, base64 DER, the root its serving certificate
// chains to.
const floorListening = "signbench floor server listening "

// floorBallast is trustbridge's floor under the heap (cmd/trustbridge's
// 8 MiB and the server's 24 MiB), so that the garbage collector paces the
// same way in both servers.
const floorBallast = 32 << 20

// floorServerID is the floor server's identity, the certificate
// service's.
var floorServerID = spiffeid.RequireFromPath(benchTD, caclient.ServerPath)

// floorKID is as long as the kid trustbridge's JWT-SVIDs carry: an RFC
// 7638 SHA-256 thumbprint in base64url.
var floorKID = strings.Repeat("k", 43)

// floorTarget is the transport floor (issue 40): a gRPC server in a
// process of its own with trustbridge's certificate service's server
// options and TLS, serving Istio's CreateCertificate and the identity
// service's MintJWTSVID with handlers that do no work, answering canned
// responses the size of trustbridge's. What it costs per call is what
// gRPC, HTTP/2, TLS and the Go runtime cost trustbridge's server; the
// clients are trustbridge's (dialClient), with a client certificate over
// mTLS, so the client side is the same too.
type floorTarget struct {
	name string // rowFloor or rowSigningFloor
	pid  int
	addr string
	root *x509.Certificate
	cert tls.Certificate // the clients' certificate, agentID's
}

// newFloorTarget starts the floor server: this test binary again, running
// only TestFloorServerProcess, stopped by closing its stdin when tb ends
// (killed, and tb failed, after 15 s).
func newFloorTarget(tb testing.TB, _ targetOptions) target {
	tb.Helper()
	return startFloor(tb, floorCanned)
}

// newSigningFloorTarget starts the signing floor (grpc-floor+signing):
// the floor server whose handlers do the in-process baseline's work on
// each request and nothing more, ca.ParseCSR and ca.SignX509SVID of the
// CSR sent (its chain PEM-encoded), jwtsvid.Mint of the audience asked
// for. It is the least any gRPC server signing with the same code can
// cost over this transport on this machine, the client process sharing
// its cores included: trustbridge's x-inproc-cpu cannot go below its.
func newSigningFloorTarget(tb testing.TB, _ targetOptions) target {
	tb.Helper()
	return startFloor(tb, floorSigning)
}

func startFloor(tb testing.TB, mode string) *floorTarget {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestFloorServerProcess$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(os.Environ(), floorEnv+"="+mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // even when a -timeout panic skips cleanups
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out := &capped{max: 64 << 10}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	listening := make(chan string, 1)
	exited := make(chan struct{})
	var waitErr error
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(io.TeeReader(stdout, out))
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), floorListening); ok {
				listening <- rest
				break
			}
		}
		_, _ = io.Copy(out, stdout)
		waitErr = cmd.Wait()
	}()
	tb.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			tb.Errorf("floor server did not stop within 15s of its stdin closing")
		}
		if waitErr != nil {
			tb.Errorf("floor server: %v:\n%s", waitErr, out.String())
		}
	})
	select {
	case l := <-listening:
		t, err := parseFloorListening(l)
		if err != nil {
			tb.Fatalf("floor server: %v", err)
		}
		t.pid, t.name = cmd.Process.Pid, rowFloor
		if mode == floorSigning {
			t.name = rowSigningFloor
		}
		leaf, key := testca.New(tb, benchTD.Name()).Issue(tb, agentID)
		t.cert = tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
		return t
	case <-exited:
		tb.Fatalf("floor server exited before it listened:\n%s", out.String())
	case <-time.After(time.Minute):
		tb.Fatalf("floor server did not listen within a minute:\n%s", out.String())
	}
	return nil
}

// parseFloorListening reads "<addr> <root, base64 DER>".
func parseFloorListening(l string) (*floorTarget, error) {
	addr, root, ok := strings.Cut(l, " ")
	if !ok {
		return nil, fmt.Errorf("want an address and a root, got %q", l)
	}
	der, err := base64.StdEncoding.DecodeString(root)
	if err != nil {
		return nil, fmt.Errorf("root: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("root: %w", err)
	}
	return &floorTarget{addr: addr, root: cert}, nil
}

func (t *floorTarget) Name() string { return t.name }

func (t *floorTarget) PID() int { return t.pid }

// CSR is the trustbridge target's, which the floor ignores.
func (t *floorTarget) CSR(tb testing.TB, key *ecdsa.PrivateKey) []byte {
	tb.Helper()
	return agentCSR(tb, key)
}

// Dial connects as the trustbridge target's clients do, verifying the
// server as spiffe://example.org/trustbridge/ca.
func (t *floorTarget) Dial(tb testing.TB) client {
	tb.Helper()
	c, err := dialClient(t.addr, caclient.ServerTLS([]*x509.Certificate{t.root}, floorServerID, &t.cert))
	if err != nil {
		tb.Fatalf("dial the floor server at %s: %v", t.addr, err)
	}
	return c
}

// TestFloorServerProcess is the floor target's server, run in a process
// of its own by newFloorTarget (with SIGNBENCH_FLOOR_SERVER=1); it skips
// otherwise. It serves on 127.0.0.1 until its stdin closes.
func TestFloorServerProcess(t *testing.T) {
	mode := os.Getenv(floorEnv)
	if mode != floorCanned && mode != floorSigning {
		t.Skipf("the floor targets' server: runs only when newFloorTarget or newSigningFloorTarget starts it (%s=%s or %s)", floorEnv, floorCanned, floorSigning)
	}
	ballast := make([]byte, floorBallast)
	defer runtime.KeepAlive(ballast)

	authority := testca.New(t, benchTD.Name())
	leaf, key := authority.Issue(t, floorServerID)
	serving := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	// As internal/server/grpc.go builds it, without the connection
	// limiter and interceptors: they are the service's own work.
	opts := append(certservice.ServerOptions(),
		grpc.Creds(credentials.NewTLS(certservice.TLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serving, nil }))),
		grpc.MaxRecvMsgSize(sds.MaxRequestSize))
	g := grpc.NewServer(opts...)
	if mode == floorSigning {
		certs, identity := floorSigners(t)
		securityv1alpha1.RegisterIstioCertificateServiceServer(g, certs)
		identityapi.RegisterIdentityServiceServer(g, identity)
	} else {
		certs, identity := floorAnswers(t)
		securityv1alpha1.RegisterIstioCertificateServiceServer(g, certs)
		identityapi.RegisterIdentityServiceServer(g, identity)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	fmt.Printf("%s%s %s\n", floorListening, ln.Addr(), base64.StdEncoding.EncodeToString(authority.Cert.Raw))

	_, _ = io.Copy(io.Discard, os.Stdin)
	g.Stop()
	require.NoError(t, <-served)
}

// floorAnswers makes the canned answers: an X509-SVID chain as
// trustbridge's (leaf, then its roots, each a PEM element) signed by
// ca.SignX509SVID, and an ES256 JWT-SVID of the claims trustbridge signs
// for the clients, each the size of trustbridge's.
func floorAnswers(tb testing.TB) (*floorCerts, *floorIdentity) {
	tb.Helper()
	root, rootKey := floorRoot(tb)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	now := time.Now().Truncate(time.Second)
	issued, err := ca.SignX509SVID(now, ca.SigningMaterial{Cert: root, Key: rootKey, Roots: []*x509.Certificate{root}},
		ca.Policy{TrustDomain: benchTD}, ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: agentID, TTL: time.Hour,
			// As long as the grant trustbridge writes into a renewable
			// leaf; the clients do not read it.
			Extensions: []pkix.Extension{{Id: authn.GrantOID, Value: make([]byte, 75)}}})
	require.NoError(tb, err)
	exp := now.Add(5 * time.Minute)
	token, err := jwtsvid.Mint(key, floorKID, jwtsvid.Claims{Subject: agentID, Audience: []string{jwtAudience}, IssuedAt: now, Expiry: exp})
	require.NoError(tb, err)
	return &floorCerts{chain: []string{string(pemCert(issued.Leaf)), string(pemCert(root))}},
		&floorIdentity{token: token, expires: exp.Unix()}
}

// floorRoot is a P-256 root shaped as trustbridge's (ca's mintRootCert):
// its subject is the leaf's issuer, so it sizes both.
func floorRoot(tb testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	serial := new(big.Int).Lsh(big.NewInt(1), 127)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{benchTD.Name()}, CommonName: "trustbridge root CA", SerialNumber: serial.Text(16)},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{benchTD.ID().URL()},
		PermittedURIDomains:   []string{benchTD.Name()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(tb, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	return cert, key
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// floorCerts answers every CreateCertificate with the same chain.
type floorCerts struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	chain []string
}

func (f *floorCerts) CreateCertificate(context.Context, *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	return &securityv1alpha1.IstioCertificateResponse{CertChain: f.chain}, nil
}

// floorIdentity answers every MintJWTSVID with the same token.
type floorIdentity struct {
	identityapi.UnimplementedIdentityServiceServer
	token   string
	expires int64
}

func (f *floorIdentity) MintJWTSVID(context.Context, *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, error) {
	return &identityapi.MintJWTSVIDResponse{Token: f.token, SpiffeId: agentID.String(), ExpiresAt: f.expires}, nil
}

// floorSigners are the signing floor's handlers: the in-process
// baseline's work (inProcess) on each request, and its answer.
func floorSigners(tb testing.TB) (*signingCerts, *signingIdentity) {
	tb.Helper()
	root, rootKey := floorRoot(tb)
	jwtKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	return &signingCerts{material: ca.SigningMaterial{Cert: root, Key: rootKey, Roots: []*x509.Certificate{root}}, rootPEM: string(pemCert(root))},
		&signingIdentity{key: jwtKey}
}

// signingCerts signs the CSR of every CreateCertificate as the in-process
// baseline does.
type signingCerts struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	material ca.SigningMaterial
	rootPEM  string
}

func (f *signingCerts) CreateCertificate(_ context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	csr, err := ca.ParseCSR([]byte(req.GetCsr()))
	if err != nil {
		return nil, err
	}
	issued, err := ca.SignX509SVID(time.Now(), f.material, ca.Policy{TrustDomain: benchTD}, ca.X509SVIDParams{PublicKey: csr.PublicKey, SPIFFEID: agentID, TTL: time.Hour})
	if err != nil {
		return nil, err
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: []string{string(pemCert(issued.Leaf)), f.rootPEM}}, nil
}

// signingIdentity mints every MintJWTSVID's token as the in-process
// baseline does.
type signingIdentity struct {
	identityapi.UnimplementedIdentityServiceServer
	key *ecdsa.PrivateKey
}

func (f *signingIdentity) MintJWTSVID(_ context.Context, req *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, error) {
	now := time.Now().Truncate(time.Second)
	exp := now.Add(5 * time.Minute)
	token, err := jwtsvid.Mint(f.key, floorKID, jwtsvid.Claims{Subject: agentID, Audience: req.GetAudience(), IssuedAt: now, Expiry: exp})
	if err != nil {
		return nil, err
	}
	return &identityapi.MintJWTSVIDResponse{Token: token, SpiffeId: agentID.String(), ExpiresAt: exp.Unix()}, nil
}

// TestFloorTarget checks the floor targets: one X509 and two JWT calls
// through trustbridge's client get answers back (from the signing floor,
// a certificate of the CSR's key and a token for each audience asked;
// from the canned floor, its one token for both),
// and the server's process is gone once the test that started it has
// ended.
func TestFloorTarget(t *testing.T) {
	testFloorTarget(t, rowFloor, newFloorTarget)
	testFloorTarget(t, rowSigningFloor, newSigningFloorTarget)
}

// floorOtherAudience is the audience TestFloorTarget asks for second.
const floorOtherAudience = "https://other.example.com"

func testFloorTarget(t *testing.T, name string, start newTarget) {
	var pid int
	t.Run(name, func(t *testing.T) {
		tgt := start(t, targetOptions{})
		require.Equal(t, name, tgt.Name())
		pid = tgt.PID()
		require.Positive(t, pid)
		c := tgt.Dial(t).(*trustbridgeClient)
		t.Cleanup(func() { _ = c.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)

		resp, err := c.createCertificate(ctx, tgt.CSR(t, key))
		require.NoError(t, err)
		require.Len(t, resp.GetCertChain(), 2, "leaf, then roots")
		leaf, err := caclient.ParsePEMCerts([]byte(resp.GetCertChain()[0]))
		require.NoError(t, err)
		require.Len(t, leaf, 1)
		assert.Equal(t, agentID.URL().String(), leaf[0].URIs[0].String())
		root, err := caclient.ParsePEMCerts([]byte(resp.GetCertChain()[1]))
		require.NoError(t, err)
		require.Len(t, root, 1)
		assert.NoError(t, leaf[0].CheckSignatureFrom(root[0]), "the leaf is signed by the root")
		if name == rowSigningFloor {
			assert.True(t, key.PublicKey.Equal(leaf[0].PublicKey), "the signing floor signs the CSR's key")
		}

		jwt, err := c.mintJWT(ctx, jwtAudience)
		require.NoError(t, err)
		assert.Equal(t, agentID.String(), jwt.GetSpiffeId())
		assert.Positive(t, jwt.GetExpiresAt())
		assert.Len(t, strings.Split(jwt.GetToken(), "."), 3, "a compact JWS")
		claims, err := spiffejwt.ParseInsecure(jwt.GetToken(), []string{jwtAudience})
		require.NoError(t, err)
		assert.Equal(t, agentID, claims.ID)
		assert.Equal(t, []string{jwtAudience}, claims.Audience)
		// A second audience: the signing floor signs what it is asked
		// for; the canned floor answers its one token, which this check
		// must tell apart.
		other, err := c.mintJWT(ctx, floorOtherAudience)
		require.NoError(t, err)
		otherClaims, err := spiffejwt.ParseInsecure(other.GetToken(), []string{floorOtherAudience})
		if name == rowSigningFloor {
			require.NoError(t, err, "a token for the second audience")
			assert.Equal(t, agentID, otherClaims.ID)
			assert.Equal(t, []string{floorOtherAudience}, otherClaims.Audience)
		} else {
			assert.Error(t, err, "the canned floor's token is for %s only", jwtAudience)
			assert.Equal(t, jwt.GetToken(), other.GetToken(), "canned")
		}

		cpu, err := procCPU(pid)
		require.NoError(t, err, "the server's CPU time is readable while it runs")
		assert.Positive(t, cpu, "a server that made a key, a certificate and a TLS handshake spent CPU")
	})
	err := syscall.Kill(pid, 0)
	assert.True(t, errors.Is(err, syscall.ESRCH), "%s server %d still exists after its test ended: %v", name, pid, err)
}

func TestParseFloorListening(t *testing.T) {
	root := testca.New(t, benchTD.Name()).Cert
	got, err := parseFloorListening("127.0.0.1:1234 " + base64.StdEncoding.EncodeToString(root.Raw))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:1234", got.addr)
	assert.True(t, root.Equal(got.root))
	for _, bad := range []string{"127.0.0.1:1234", "127.0.0.1:1234 !!", "127.0.0.1:1234 " + base64.StdEncoding.EncodeToString([]byte("not DER"))} {
		_, err := parseFloorListening(bad)
		assert.Error(t, err, bad)
	}
}
