package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"math"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestMain stops the shared real API server (internal/testkit/kubetest) after the
// package's tests, if one of them started it.
// cliEnv makes the test binary run the CLI on its arguments instead of
// the tests: a real trustbridge process for tests that need one (a
// server to kill with SIGKILL).
const cliEnv = "TRUSTBRIDGE_TEST_RUN_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(cliEnv) == "1" {
		main()
	}
	os.Exit(kubetest.Main(m))
}

func TestGRPCFlagDefaults(t *testing.T) {
	f := newServerCmd(env{}).Flags()
	for flag, want := range map[string]string{
		"grpc-listen":          ":15012",
		"grpc-dns-names":       "[]",
		"ca-response-roots":    "local",
		"token-audience":       "",
		"cluster-id":           "",
		"bootstrap-token-file": "",
		"sign-rate-limit":      "0",
		"sign-queue-size":      "64",
		"kubeconfig":           "",
		"token-review":         "auto",
	} {
		fl := f.Lookup(flag)
		if assert.NotNil(t, fl, flag) {
			assert.Equal(t, want, fl.DefValue, flag)
		}
	}
}

// serverError runs the server with o and returns its error; a server that
// starts after all is stopped and yields nil.
func serverError(t *testing.T, o Config) error {
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

func TestGRPCFlagErrors(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	tokens := writeFile(t, laptopToken+","+laptopID.String()+"\n", 0o600)
	tests := []struct {
		name string
		o    GRPCConfig
		want string
	}{
		{"wildcard dns name", GRPCConfig{TokenReview: TokenReviewOff, DNSNames: []string{"*.example"}}, "--grpc-dns-names"},
		{"ip as dns name", GRPCConfig{TokenReview: TokenReviewOff, DNSNames: []string{"10.0.0.1"}}, "--grpc-dns-names"},
		{"response roots", GRPCConfig{ResponseRoots: "all"}, "--ca-response-roots"},
		{"token review mode", GRPCConfig{TokenReview: "yes"}, "--token-review"},
		{"token review on without Kubernetes", GRPCConfig{TokenReview: TokenReviewOn}, "--token-review on needs"},
		{"missing kubeconfig", GRPCConfig{Kubeconfig: filepath.Join(t.TempDir(), "none")}, "--kubeconfig"},
		{"missing bootstrap file", GRPCConfig{TokenReview: TokenReviewOff, BootstrapFile: filepath.Join(t.TempDir(), "none")}, "--bootstrap-token-file"},
		{"bad bootstrap file", GRPCConfig{TokenReview: TokenReviewOff, BootstrapFile: writeFile(t, "short,spiffe://example.org/x\n", 0o600)}, "--bootstrap-token-file"},
		{"bootstrap file of another trust domain", GRPCConfig{TokenReview: TokenReviewOff, BootstrapFile: writeFile(t, laptopToken+",spiffe://other.example/x\n", 0o600)}, "other.example"},
		{"negative rate", GRPCConfig{rateLimit: -1}, "--sign-rate-limit"},
		{"NaN rate", GRPCConfig{rateLimit: math.NaN()}, "--sign-rate-limit"},
		{"negative queue", GRPCConfig{queueSize: -1}, "--sign-queue-size"},
		{"port taken", GRPCConfig{TokenReview: TokenReviewOff, BootstrapFile: tokens}, "--grpc-listen"},
	}
	taken := reservePortHeld(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := baseServerOptions("example.org", t.TempDir())
			o.GRPC = tt.o
			o.GRPC.Listen = "127.0.0.1:0"
			if tt.name == "port taken" {
				o.GRPC.Listen = taken
			}
			err := serverError(t, o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// reservePortHeld returns an address something listens on for the test.
func reservePortHeld(t *testing.T) string {
	t.Helper()
	addr := reservePort(t)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	return addr
}

func TestServerWithoutGRPC(t *testing.T) {
	_, banner := startServer(t, t.TempDir()) // the test helper leaves --grpc-listen ""
	assert.Nil(t, logRecord(banner.String(), "certificate service listening"))
}

func TestLoadKubeConfig(t *testing.T) {
	t.Run("no Kubernetes", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		cfg, ok, err := loadKubeConfig("")
		assert.NoError(t, err)
		assert.False(t, ok)
		assert.Nil(t, cfg)
	})
	t.Run("in a pod without a service account", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
		t.Setenv("KUBERNETES_SERVICE_PORT", "443")
		_, ok, err := loadKubeConfig("")
		assert.ErrorContains(t, err, "in-cluster Kubernetes config")
		assert.False(t, ok)
	})
	t.Run("kubeconfig file", func(t *testing.T) {
		path := writeKubeconfig(t, "https://127.0.0.1:6443", nil)
		cfg, ok, err := loadKubeConfig(path)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Equal(t, "https://127.0.0.1:6443", cfg.Host)
		assert.Contains(t, cfg.UserAgent, "trustbridge")
	})
	t.Run("missing file", func(t *testing.T) {
		_, _, err := loadKubeConfig(filepath.Join(t.TempDir(), "kubeconfig"))
		assert.ErrorContains(t, err, "--kubeconfig")
	})
}

// writeKubeconfig writes a kubeconfig for host, with the CA and client
// credentials of from when given.
func writeKubeconfig(t *testing.T, host string, from *kubetest.Env) string {
	t.Helper()
	cluster := &clientcmdapi.Cluster{Server: host}
	user := &clientcmdapi.AuthInfo{}
	if from != nil {
		c := from.Config
		cluster.CertificateAuthorityData = c.CAData
		user.ClientCertificateData, user.ClientKeyData, user.Token = c.CertData, c.KeyData, c.BearerToken
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = cluster
	cfg.AuthInfos["test"] = user
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// TestCARequestWithServiceAccountToken runs the whole path against a real
// API server: `trustbridge server --kubeconfig` reviews a service account
// token from the TokenRequest API, and `ca request --token-file` receives
// spiffe://example.org/ns/<ns>/sa/web.
func TestCARequestWithServiceAccountToken(t *testing.T) {
	k := kubetest.Shared(t)
	kubeconfig := writeKubeconfig(t, k.Config.Host, k)
	addr, rootCert, _ := grpcServer(t, func(o *Config) {
		o.GRPC.TokenReview = TokenReviewOn
		o.GRPC.Kubeconfig = kubeconfig
		o.GRPC.ClusterID = "east"
	})
	ns := k.Namespace(t)
	want := spiffeid.RequireFromString("spiffe://example.org/ns/" + ns + "/sa/web")

	good := writeFile(t, k.ServiceAccountToken(t, ns, "web", []string{"example.org"}, 10*time.Minute), 0o600)
	out := filepath.Join(t.TempDir(), "creds")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", good, "--credentials-dir", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "issued "+want.String())
	checkCreds(t, out, want)

	// Istio's agents say which cluster their token is from (ClusterID
	// metadata): this server's own is accepted, another is refused before
	// any review, as istiod refuses a cluster it does not know.
	roots, err := readPEMCerts(rootCert)
	require.NoError(t, err)
	token, err := caclient.ReadToken(good)
	require.NoError(t, err)
	serverTLS := caclient.ServerTLS(roots, spiffeid.RequireFromPath(want.TrustDomain(), GRPCServingPath), nil)
	for cluster, wantCode := range map[string]codes.Code{"east": codes.OK, "west": codes.Unauthenticated} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "ClusterID", cluster)
		_, err := caclient.CreateCertificate(ctx, addr, serverTLS, caclient.Request{Key: testca.NewKey(t, testca.ECP256), Token: token})
		assert.Equal(t, wantCode, status.Code(err), "ClusterID %s: %v", cluster, err)
	}

	// A token for another audience is refused.
	wrong := writeFile(t, k.ServiceAccountToken(t, ns, "web", []string{"someone-else"}, 10*time.Minute), 0o600)
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", wrong, "--credentials-dir", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "did not accept the credentials")
}

// TestGRPCDNSNames: a client that checks a host name (an Istio agent
// dialing the CA by Service name) verifies the serving certificate with
// --grpc-dns-names, and only for those names.
func TestGRPCDNSNames(t *testing.T) {
	addr, rootCert, _ := grpcServer(t, func(o *Config) {
		o.GRPC.DNSNames = []string{"trustbridge.trustbridge-system.svc", " Trustbridge.Example "}
	})
	roots, err := readPEMCerts(rootCert)
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
