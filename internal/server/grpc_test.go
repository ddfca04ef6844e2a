package server

import (
	"context"
	"github.com/spf13/pflag"
	"math"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

func TestGRPCFlagDefaults(t *testing.T) {
	f := serverCmdFlags()
	for flag, want := range map[string]string{
		"grpc-listen":          ":15012",
		"grpc-dns-names":       "[]",
		"ca-response-roots":    "local",
		"token-audience":       "",
		"cluster-id":           "",
		"bootstrap-token-file": "",
		"sign-rate-limit":      "0",
		"sign-queue-size":      "12288",
		"sign-concurrency":     "0",
		"sign-queue-timeout":   "20s",
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
	tokens := servertest.WriteFile(t, servertest.LaptopToken+","+servertest.LaptopID.String()+"\n", 0o600)
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
		{"bad bootstrap file", GRPCConfig{TokenReview: TokenReviewOff, BootstrapFile: servertest.WriteFile(t, "short,spiffe://example.org/x\n", 0o600)}, "--bootstrap-token-file"},
		{"bootstrap file of another trust domain", GRPCConfig{TokenReview: TokenReviewOff, BootstrapFile: servertest.WriteFile(t, servertest.LaptopToken+",spiffe://other.example/x\n", 0o600)}, "other.example"},
		{"negative rate", GRPCConfig{rateLimit: -1}, "--sign-rate-limit"},
		{"NaN rate", GRPCConfig{rateLimit: math.NaN()}, "--sign-rate-limit"},
		{"negative queue", GRPCConfig{queueSize: -1}, "--sign-queue-size"},
		{"negative concurrency", GRPCConfig{signConcurrency: -1}, "--sign-concurrency"},
		{"negative queue timeout", GRPCConfig{queueTimeout: -time.Second}, "--sign-queue-timeout"},
		{"node agent of another trust domain", GRPCConfig{TokenReview: TokenReviewOff, NodeAgents: []string{"spiffe://other.example/vm/a=spiffe://example.org/vm/a/app"}}, "--ca-node-agent"},
		{"node agent without identities", GRPCConfig{TokenReview: TokenReviewOff, NodeAgents: []string{"spiffe://example.org/vm/a"}}, "AGENT_SPIFFE_ID=ID"},
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
	addr := servertest.ReservePort(t)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	return addr
}

// Node agents listed for a certificate service that is off are an
// operator's mistake to hear about, not to ignore.
func TestNodeAgentsNeedGRPC(t *testing.T) {
	o := baseServerOptions("example.org", t.TempDir())
	o.GRPC = GRPCConfig{NodeAgents: []string{"spiffe://example.org/vm/a=spiffe://example.org/vm/a/app"}}
	err := serverError(t, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `--ca-node-agent lets node agents ask the certificate service, which --grpc-listen "" turns off`)
}

func TestServerWithoutGRPC(t *testing.T) {
	_, banner := startServer(t, t.TempDir()) // the test helper leaves --grpc-listen ""
	assert.Nil(t, servertest.LogRecord(banner.String(), "certificate service listening"))
}

func TestLoadKubeConfig(t *testing.T) {
	t.Run("no Kubernetes", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		cfg, ok, err := LoadKubeConfig("")
		assert.NoError(t, err)
		assert.False(t, ok)
		assert.Nil(t, cfg)
	})
	t.Run("in a pod without a service account", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
		t.Setenv("KUBERNETES_SERVICE_PORT", "443")
		_, ok, err := LoadKubeConfig("")
		assert.ErrorContains(t, err, "in-cluster Kubernetes config")
		assert.False(t, ok)
	})
	t.Run("kubeconfig file", func(t *testing.T) {
		path := servertest.WriteKubeconfig(t, "https://127.0.0.1:6443", nil)
		cfg, ok, err := LoadKubeConfig(path)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Equal(t, "https://127.0.0.1:6443", cfg.Host)
		assert.Contains(t, cfg.UserAgent, "trustbridge")
	})
	t.Run("missing file", func(t *testing.T) {
		_, _, err := LoadKubeConfig(filepath.Join(t.TempDir(), "kubeconfig"))
		assert.ErrorContains(t, err, "--kubeconfig")
	})
}

// serverCmdFlags is the flag set of trustbridge server, on a scratch
// Config: what cmd/trustbridge registers.
func serverCmdFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	var o Config
	o.AddFlags(fs)
	return fs
}
