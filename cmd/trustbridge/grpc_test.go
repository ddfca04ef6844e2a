package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestMain stops the shared real API server (internal/testkit/kubetest) after the
// package's tests, if one of them started it, then fails them if any
// goroutine outlives them (the agent's tests run its Run loop here).
// cliEnv makes the test binary run the CLI on its arguments instead of
// the tests: a real trustbridge process for tests that need one (a
// server to kill with SIGKILL).
const cliEnv = "TRUSTBRIDGE_TEST_RUN_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(cliEnv) == "1" {
		main()
	}
	goleak.VerifyTestMain(kubetest.Tests(m))
}

// serverError runs the server with o and returns its error; a server that
// starts after all is stopped and yields nil.
func serverError(t *testing.T, o server.Config) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	e, _, _ := testEnv(t, o.LogFormat)
	go func() {
		done <- runServer(ctx, e, o, ready)
	}()
	select {
	case <-ready:
		cancel()
		<-done
		return nil
	case err := <-done:
		return err
	}
}

// TestCARequestWithServiceAccountToken runs the whole path against a real
// API server: `trustbridge server --kubeconfig` reviews a service account
// token from the TokenRequest API, and `ca request --token-file` receives
// spiffe://example.org/ns/<ns>/sa/web.
func TestCARequestWithServiceAccountToken(t *testing.T) {
	k := kubetest.Shared(t)
	kubeconfig := servertest.WriteKubeconfig(t, k.Config.Host, k)
	addr, rootCert, _ := grpcServer(t, func(o *server.Config) {
		o.GRPC.TokenReview = server.TokenReviewOn
		o.GRPC.Kubeconfig = kubeconfig
		o.GRPC.ClusterID = "east"
	})
	ns := k.Namespace(t)
	want := spiffeid.RequireFromString("spiffe://example.org/ns/" + ns + "/sa/web")

	good := servertest.WriteFile(t, k.ServiceAccountToken(t, ns, "web", []string{"example.org"}, 10*time.Minute), 0o600)
	out := filepath.Join(t.TempDir(), "creds")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", good, "--credentials-dir", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "issued "+want.String())
	checkCreds(t, out, want)

	// Istio's agents say which cluster their token is from (ClusterID
	// metadata): this server's own is accepted, another is refused before
	// any review, as istiod refuses a cluster it does not know.
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	token, err := caclient.ReadToken(good)
	require.NoError(t, err)
	serverTLS := caclient.ServerTLS(roots, spiffeid.RequireFromPath(want.TrustDomain(), server.GRPCServingPath), nil)
	for cluster, wantCode := range map[string]codes.Code{"east": codes.OK, "west": codes.Unauthenticated} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "ClusterID", cluster)
		_, err := caclient.CreateCertificate(ctx, addr, serverTLS, caclient.Request{Key: testca.NewKey(t, testca.ECP256), Token: token})
		assert.Equal(t, wantCode, status.Code(err), "ClusterID %s: %v", cluster, err)
	}

	// A token for another audience is refused.
	wrong := servertest.WriteFile(t, k.ServiceAccountToken(t, ns, "web", []string{"someone-else"}, 10*time.Minute), 0o600)
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", wrong, "--credentials-dir", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "did not accept the credentials")
}

// TestGRPCDNSNames: a client that checks a host name (an Istio agent
// dialing the CA by Service name) verifies the serving certificate with
// --grpc-dns-names, and only for those names.
func TestGRPCDNSNames(t *testing.T) {
	addr, rootCert, _ := grpcServer(t, func(o *server.Config) {
		o.GRPC.DNSNames = []string{"trustbridge.trustbridge-system.svc", " Trustbridge.Example "}
	})
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	for _, c := range roots {
		pool.AddCert(c)
	}
	dial := func(name string) error {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: name, NextProtos: []string{"h2"}})
		if err == nil {
			conn.Close()
		}
		return err
	}
	assert.NoError(t, dial("trustbridge.trustbridge-system.svc"))
	assert.NoError(t, dial("trustbridge.example"), "names are trimmed and lowercased")
	var hostErr x509.HostnameError
	assert.ErrorAs(t, dial("attacker.example"), &hostErr)
}
