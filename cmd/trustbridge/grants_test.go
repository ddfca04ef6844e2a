package main

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/sds"
)

// TestRenewalRefusedAfterBootstrapTokenRemoved is the regression test of
// renewals outliving their grant: a laptop bootstraps with a token, renews
// with the certificate it got, and once the operator removes the token from
// the file the next renewal is refused with a message that says why and
// what to do, while another token's holder is still served.
func TestRenewalRefusedAfterBootstrapTokenRemoved(t *testing.T) {
	const otherToken = "other-bootstrap-token-0123456789"
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(servertest.LaptopToken+","+servertest.LaptopID.String()+"\n"+otherToken+",spiffe://example.org/vm/other\n"), 0o600))
	reloaded := make(chan struct{}, 1)
	dataDir := t.TempDir()
	admin, banner := startServer(t, dataDir, func(o *server.Config) {
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff,
			GrantHooks: server.GrantHooks{BootstrapReload: 10 * time.Millisecond, OnBootstrapReload: func(changed bool, err error) {
				if changed && err == nil {
					select {
					case reloaded <- struct{}{}:
					default:
					}
				}
			}}}
	})
	addr := servertest.GRPCAddr(t, banner.String())
	_, roots, err := ca.NewStore(dataDir).Load("example.org")
	require.NoError(t, err)
	var certs []*x509.Certificate
	for _, r := range roots {
		certs = append(certs, r.Cert)
	}
	rootCert := servertest.WriteFile(t, string(cli.CertsPEM(certs)), 0o644)

	// Bootstrap: the certificate records the token's grant, never the token.
	out := filepath.Join(t.TempDir(), "creds")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--token-file", servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600), "--credentials-dir", out)
	require.Equal(t, 0, code, stderr)
	first := checkCreds(t, out, servertest.LaptopID)
	grant, err := authn.GrantFromCert(first)
	require.NoError(t, err)
	assert.Equal(t, authn.MethodBootstrapToken, grant.Method)
	assert.Equal(t, authn.BootstrapGrantRef(sha256.Sum256([]byte(servertest.LaptopToken))), grant.Ref)
	assert.NotContains(t, string(first.Raw), servertest.LaptopToken)

	// Renewal with the certificate works and carries the same grant.
	renewed := filepath.Join(t.TempDir(), "renewed")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--prov-cert", out, "--credentials-dir", renewed)
	require.Equal(t, 0, code, stderr)
	second := checkCreds(t, renewed, servertest.LaptopID)
	again, err := authn.GrantFromCert(second)
	require.NoError(t, err)
	assert.Equal(t, grant, again)

	// The operator removes the laptop's token, replacing the file
	// atomically as the flag's help says (os.WriteFile truncates first: a
	// reload in between would see no tokens at all); the server reloads it.
	next := tokens + ".new"
	require.NoError(t, os.WriteFile(next, []byte(otherToken+",spiffe://example.org/vm/other\n"), 0o600))
	require.NoError(t, os.Rename(next, tokens))
	select {
	case <-reloaded:
	case <-t.Context().Done():
		t.Fatal("the token file was not reloaded")
	}

	// SDS on the same listener, which mints certificates too, refuses the
	// revoked chain as well, while a token still opens a stream.
	cert, err := tls.LoadX509KeyPair(filepath.Join(renewed, "cert-chain.pem"), filepath.Join(renewed, "key.pem"))
	require.NoError(t, err)
	e := openEnvoy(t, dialSDSWithCert(t, addr, certs, &cert), nil, sds.RootCAName)
	select {
	case r := <-e.resps:
		t.Fatalf("SDS answered a revoked chain: %v", r)
	case err := <-e.errs:
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	case <-t.Context().Done():
		t.Fatal("the SDS stream was neither refused nor answered")
	}

	// Both certificates of the chain are refused now, with the reason.
	for _, dir := range []string{renewed, out} {
		_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
			"--prov-cert", dir, "--credentials-dir", t.TempDir())
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "refused to issue this identity: renewal refused: the bootstrap token that granted "+
			servertest.LaptopID.String()+" (reference "+grant.Ref+") was removed; bootstrap again")
	}
	// Presenting the removed token itself is refused too, and the other
	// token still bootstraps.
	_, _, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--token-file", servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600), "--credentials-dir", t.TempDir())
	assert.Equal(t, 1, code)
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--token-file", servertest.WriteFile(t, otherToken+"\n", 0o600), "--credentials-dir", t.TempDir())
	assert.Equal(t, 0, code, stderr)

	_, metrics := servertest.Get(t, "http://"+admin+"/metrics")
	assert.Contains(t, metrics, `trustbridge_certservice_renewal_grant_checks_total{grant_method="bootstrap-token",result="accepted",trust_domain="example.org"} 1`)
	assert.Contains(t, metrics, `trustbridge_certservice_renewal_grant_checks_total{grant_method="bootstrap-token",result="revoked",trust_domain="example.org"} 2`)
}

// TestRenewalWithServiceAccountGrant runs the Kubernetes grant through a
// real API server: the certificate a service account token bought records
// the account's UID from TokenReview, renews while the account exists,
// and stops renewing once it is deleted.
func TestRenewalWithServiceAccountGrant(t *testing.T) {
	k := kubetest.Shared(t)
	ns := k.Namespace(t)
	deleted := make(chan struct{}, 1)
	addr, rootCert, _ := grpcServer(t, func(o *server.Config) {
		o.GRPC.TokenReview = server.TokenReviewOn
		o.GRPC.Kubeconfig = servertest.WriteKubeconfig(t, k.Config.Host, k)
		o.GRPC.OnServiceAccountDeleted = func(namespace, _ string) {
			if namespace == ns {
				deleted <- struct{}{}
			}
		}
	})
	want := spiffeid.RequireFromString("spiffe://example.org/ns/" + ns + "/sa/web")
	token := servertest.WriteFile(t, k.ServiceAccountToken(t, ns, "web", []string{"example.org"}, 10*time.Minute), 0o600)
	sa, err := k.Client.CoreV1().ServiceAccounts(ns).Get(t.Context(), "web", metav1.GetOptions{})
	require.NoError(t, err)

	out := filepath.Join(t.TempDir(), "creds")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--credentials-dir", out)
	require.Equal(t, 0, code, stderr)
	grant, err := authn.GrantFromCert(checkCreds(t, out, want))
	require.NoError(t, err)
	assert.Equal(t, authn.MethodKubernetesJWT, grant.Method)
	assert.Equal(t, ns+"/web", grant.Ref)
	assert.Equal(t, string(sa.UID), grant.UID)

	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--renew", "--credentials-dir", out)
	require.Equal(t, 0, code, stderr)

	// Deleted and re-created under the same name: once the server has seen
	// the deletion, the old chain is refused, and the new account's token
	// starts a new one.
	require.NoError(t, k.Client.CoreV1().ServiceAccounts(ns).Delete(t.Context(), "web", metav1.DeleteOptions{}))
	select {
	case <-deleted:
	case <-t.Context().Done():
		t.Fatal("the server did not see the deletion")
	}
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--prov-cert", out, "--credentials-dir", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "renewal refused: the service account "+ns+"/web that granted "+want.String()+" was deleted or re-created")

	token = servertest.WriteFile(t, k.ServiceAccountToken(t, ns, "web", []string{"example.org"}, 10*time.Minute), 0o600)
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--prov-cert", out, "--credentials-dir", t.TempDir())
	assert.Equal(t, 1, code, "the re-created account does not revive the old chain")
	assert.Contains(t, stderr, "was deleted or re-created")
	fresh := filepath.Join(t.TempDir(), "fresh")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--credentials-dir", fresh)
	require.Equal(t, 0, code, stderr)
	newGrant, err := authn.GrantFromCert(checkCreds(t, fresh, want))
	require.NoError(t, err)
	assert.NotEqual(t, grant.UID, newGrant.UID)
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--renew", "--credentials-dir", fresh)
	assert.Equal(t, 0, code, stderr)
}

// dialSDSWithCert connects to the server's gRPC listener with a client
// certificate, verifying the server as dialSDSTLS does.
func dialSDSWithCert(t *testing.T, addr string, roots []*x509.Certificate, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	td := servertest.LaptopID.TrustDomain()
	store := trust.NewStore()
	store.Set("bootstrap", spiffebundle.FromX509Authorities(td, roots))
	cfg := trust.ClientTLSConfig(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil },
		&trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, server.GRPCServingPath))})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestSDSMintedCertificateIsNoCredential: a certificate SDS minted for an
// Envoy is marked so, and neither renews at the certificate service nor
// opens another SDS stream: otherwise it would start a renewal chain of
// its own, whatever became of the token the Envoy authenticated with.
func TestSDSMintedCertificateIsNoCredential(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	td := servertest.LaptopID.TrustDomain()

	e := openEnvoy(t, dialSDSTLS(t, addr, td, roots, servertest.LaptopToken), nil, sds.DefaultName)
	resp := e.recv(30 * time.Second)
	s, ok := secrets(t, resp)[sds.DefaultName]
	require.True(t, ok, "the caller's certificate is served")
	tc := s.GetTlsCertificate()
	pair, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	grant, err := authn.GrantFromCert(leaf)
	require.NoError(t, err)
	assert.Equal(t, authn.GrantMethodSDS, grant.Method)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert-chain.pem"), tc.GetCertificateChain().GetInlineBytes(), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), tc.GetPrivateKey().GetInlineBytes(), 0o600))
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--prov-cert", dir, "--credentials-dir", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "was minted by SDS for Envoy and cannot be renewed")

	again := openEnvoy(t, dialSDSWithCert(t, addr, roots, &pair), nil, sds.RootCAName)
	select {
	case r := <-again.resps:
		t.Fatalf("SDS answered a certificate it minted: %v", r)
	case err := <-again.errs:
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	case <-t.Context().Done():
		t.Fatal("the SDS stream was neither refused nor answered")
	}
}
