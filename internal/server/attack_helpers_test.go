package server

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// attackTarget is a running server whose certificate service/SDS listener
// is attacked in the issue 14 regression tests and benchmarks: its gRPC
// and admin addresses and its log.
type attackTarget struct {
	grpc, admin string
	logs        *testlog.Buffer
}

// startAttackTarget runs a server with the certificate service on
// loopback and a bootstrap token for laptopID, as grpcServer does, but
// keeps its log and takes a testing.TB for benchmarks.
func startAttackTarget(tb testing.TB, mutate func(*Config)) *attackTarget {
	tb.Helper()
	tokens := filepath.Join(tb.TempDir(), "tokens.csv")
	require.NoError(tb, os.WriteFile(tokens, []byte(servertest.LaptopToken+","+servertest.LaptopID.String()+"\n"), 0o600))
	o := baseServerOptions("example.org", tb.TempDir())
	o.GRPC = GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: TokenReviewOff}
	if mutate != nil {
		mutate(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	e, _, logs := testEnv(tb, o.LogFormat)
	at := &attackTarget{logs: logs}
	go func() {
		done <- runServer(ctx, e, o, ready)
	}()
	select {
	case at.admin = <-ready:
	case err := <-done:
		cancel()
		tb.Fatalf("server exited: %v\n%s", err, at.logs.String())
	}
	tb.Cleanup(func() {
		cancel()
		<-done
	})
	at.grpc = servertest.GRPCAddr(tb, logs.String())
	return at
}

// metric sums the samples of name whose labels contain every one of
// labels (`result="verified"`), as the admin listener serves them.
func (at *attackTarget) metric(tb testing.TB, name string, labels ...string) float64 {
	tb.Helper()
	return servertest.MetricVia(tb, http.DefaultClient, at.admin, name, labels...)
}

// logCount counts the log lines at level (JSON logs) containing msg.
func (at *attackTarget) logCount(level, msg string) int {
	n := 0
	for _, l := range strings.Split(at.logs.String(), "\n") {
		if strings.Contains(l, `"level":"`+level+`"`) && strings.Contains(l, msg) {
			n++
		}
	}
	return n
}

// dialFrom connects to the certificate service from the loopback address
// local (127.0.0.0/8 is all loopback on Linux), so that clients look like
// different hosts to per-address limits. The server's certificate is not
// checked: these clients test the server's authentication of them.
func dialFrom(tb testing.TB, addr, local string, cert *tls.Certificate) securityv1alpha1.IstioCertificateServiceClient {
	tb.Helper()
	cc := dialConn(tb, addr, local, cert)
	tb.Cleanup(func() { _ = cc.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(cc)
}

// dialConn is dialFrom's connection, for a caller that closes it.
func dialConn(tb testing.TB, addr, local string, cert *tls.Certificate) *grpc.ClientConn {
	tb.Helper()
	return dialConnWith(tb, addr, local, cert, func(c net.Conn) net.Conn { return c })
}

func withBearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// csrFor is a PEM CSR for id with a fresh P-256 key.
func csrFor(tb testing.TB, id spiffeid.ID) (string, crypto.Signer) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id.URL()}}, key)
	require.NoError(tb, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), key
}

// legitSVID gets laptopID's X509-SVID with the bootstrap token, as a
// workload's first request does, and returns it as a client certificate
// with a CSR to renew it with.
func legitSVID(tb testing.TB, at *attackTarget, local string) (*tls.Certificate, string) {
	tb.Helper()
	csr, key := csrFor(tb, servertest.LaptopID)
	c := dialFrom(tb, at.grpc, local, nil)
	resp, err := c.CreateCertificate(withBearer(context.Background(), servertest.LaptopToken), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	require.NoError(tb, err)
	cert := &tls.Certificate{PrivateKey: key}
	for _, p := range resp.GetCertChain()[:len(resp.GetCertChain())-1] {
		b, _ := pem.Decode([]byte(p))
		require.NotNil(tb, b)
		cert.Certificate = append(cert.Certificate, b.Bytes)
	}
	return cert, csr
}

// expensiveChain is the chain of issue 14 item 2 as a client certificate:
// an X509-SVID of the local trust domain whose issuer is one of seven CA
// certificates sharing one subject, each with an RSA-8192 key and the
// public exponent 2^31-1. Every signature is 1,024 random bytes under an
// RSA algorithm: none is valid, and Go's chain builder spends a full
// RSA-8192 verification with that exponent on each candidate all the
// same, which is the attack.
func expensiveChain(tb testing.TB, id spiffeid.ID) *tls.Certificate {
	tb.Helper()
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	// Any RSA key makes CreateCertificate write an RSA signature
	// algorithm; the signature is replaced afterwards.
	signer := testca.NewKey(tb, testca.RSA2048)
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 8191))
	require.NoError(tb, err)
	n.SetBit(n, 8191, 1).SetBit(n, 0, 1)
	huge := &rsa.PublicKey{N: n, E: 1<<31 - 1}
	subject := pkix.Name{CommonName: "one subject"}
	parent := &x509.Certificate{Subject: subject, SubjectKeyId: []byte{1}}
	now := time.Now().Add(-time.Minute)
	sign := func(tmpl *x509.Certificate, pub any) []byte {
		tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = big.NewInt(time.Now().UnixNano()), now, now.Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
		require.NoError(tb, err)
		return withRandomSignature(tb, der, 1024)
	}
	cert := &tls.Certificate{PrivateKey: leafKey}
	cert.Certificate = append(cert.Certificate, sign(&x509.Certificate{Subject: pkix.Name{CommonName: "leaf"}, URIs: []*url.URL{id.URL()}}, &leafKey.PublicKey))
	for range 7 {
		cert.Certificate = append(cert.Certificate, sign(&x509.Certificate{Subject: subject, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, huge))
	}
	return cert
}

// withRandomSignature replaces a certificate's signature with n random
// bytes (below any n-byte modulus), keeping its algorithm.
func withRandomSignature(tb testing.TB, der []byte, n int) []byte {
	tb.Helper()
	var c struct {
		TBS asn1.RawValue
		Alg pkix.AlgorithmIdentifier
		Sig asn1.BitString
	}
	_, err := asn1.Unmarshal(der, &c)
	require.NoError(tb, err)
	sig := make([]byte, n)
	_, _ = rand.Read(sig[1:])
	c.Sig = asn1.BitString{Bytes: sig, BitLength: 8 * n}
	out, err := asn1.Marshal(c)
	require.NoError(tb, err)
	return out
}

// rogueSVID is a well-formed X509-SVID of the local trust domain from a
// CA that is not ours: it passes every bound and fails verification.
func rogueSVID(tb testing.TB, id spiffeid.ID) *tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "rogue"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), URIs: []*url.URL{id.URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// kubeconfigFor writes a kubeconfig with k's address and credentials.
func kubeconfigFor(tb testing.TB, k *kubetest.Env) string {
	tb.Helper()
	c := k.Config
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertData, ClientKeyData: c.KeyData, Token: c.BearerToken}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(tb.TempDir(), "kubeconfig")
	require.NoError(tb, clientcmd.WriteToFile(*cfg, path))
	return path
}

// junkToken is the flood of issue 14 item 3: a JWT-shaped token, distinct
// every call. Kinds: 0, random claims; 1, the claims of a service
// account token for our audience with a random signature; 2, the same
// naming a key id the issuer does not have.
func junkToken(ns string, i, kind int) string {
	enc := func(v string) string { return base64.RawURLEncoding.EncodeToString([]byte(v)) }
	exp := time.Now().Add(time.Hour).Unix()
	header := `{"alg":"RS256","kid":"` + fmt.Sprint(i) + `"}`
	claims := fmt.Sprintf(`{"sub":"junk-%d","exp":%d}`, i, exp)
	if kind > 0 {
		claims = fmt.Sprintf(`{"iss":"https://kubernetes.default.svc.cluster.local","sub":"system:serviceaccount:%s:pod-%d","aud":["example.org"],"exp":%d,"jti":"%d"}`, ns, i%10, exp, i)
	}
	if kind == 1 {
		header = `{"alg":"RS256"}`
	}
	sig := make([]byte, 256)
	_, _ = rand.Read(sig)
	return enc(header) + "." + enc(claims) + "." + base64.RawURLEncoding.EncodeToString(sig)
}
