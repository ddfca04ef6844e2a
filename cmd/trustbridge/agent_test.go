package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// startAgent runs `trustbridge agent` with o until the test ends and waits
// for its socket to appear.
func startAgent(t *testing.T, o agent.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	e, _, logs := testEnv(t, o.LogFormat)
	go func() {
		done <- runAgent(ctx, e, o)
	}()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done, "agent: clean shutdown\n%s", logs.String())
	})
	// The condition runs on another goroutine: an agent that exits is
	// noted there and failed here.
	var exited atomic.Bool
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			exited.Store(true)
			return true
		default:
		}
		fi, err := os.Stat(o.Socket)
		return err == nil && fi.Mode()&os.ModeSocket != 0
	}, 30*time.Second, 10*time.Millisecond, "the agent's socket never appeared")
	if exited.Load() {
		err := <-done
		done <- err
		t.Fatalf("agent exited: %v\n%s", err, logs.String())
	}
}

// agentFor is an agent of a trust domain whose certificate service is at
// addr, authenticating with token, trusting rootsPEM for the server.
func agentFor(t *testing.T, addr string, rootsPEM []byte, token string) agent.Config {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "root-cert.pem"), rootsPEM, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600))
	return agent.Config{
		Socket:         filepath.Join(dir, "sds.sock"),
		CredentialsDir: filepath.Join(dir, "creds"),
		KeepCerts:      true, // as when --credentials-dir is given
		CAAddr:         addr,
		RootCert:       filepath.Join(dir, "root-cert.pem"),
		TokenFile:      filepath.Join(dir, "token"),
		GraceRatio:     0.5,
		PollInterval:   time.Second,
		LogFormat:      "json",
		LogLevel:       "debug",
	}
}

func TestAgentRenewsAtGracePeriod(t *testing.T) {
	// A single-use token: it buys the first certificate, so every
	// renewal must go by that certificate (mTLS).
	addr, rootCert, _ := grpcServerWithTokens(t, servertest.LaptopToken+","+servertest.LaptopID.String()+"\n")
	rootsPEM, err := os.ReadFile(rootCert)
	require.NoError(t, err)
	roots, err := cli.ParsePEMCerts(rootsPEM)
	require.NoError(t, err)
	o := agentFor(t, addr, rootsPEM, servertest.LaptopToken)
	// 20s asked, 30s valid (the CA backdates by 10s): renewed 5s in.
	o.TTL = 20 * time.Second
	startAgent(t, o)

	info, err := os.Stat(o.Socket)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "only the agent's user may use the socket")

	e := openEnvoy(t, dialSDSUnix(t, o.Socket), nil, sds.DefaultName, sds.RootCAName, sds.AllName)
	r := e.recv(10 * time.Second)
	got := secrets(t, r)
	require.Len(t, got, 3)
	id, first := workloadCert(t, got[sds.DefaultName], servertest.LaptopID.TrustDomain(), roots)
	assert.Equal(t, servertest.LaptopID, id, "the identity the token proves")
	sameCerts(t, roots, trustedCA(t, got[sds.RootCAName]), "ROOTCA relayed from the server")
	names, _ := spiffeValidator(t, got[sds.AllName])
	assert.Equal(t, []string{"example.org"}, names)
	e.ack(r)
	written := checkCreds(t, o.CredentialsDir, servertest.LaptopID)
	assert.Equal(t, first.SerialNumber, written.SerialNumber, "--credentials-dir holds the served certificate")

	// Past the grace period the agent renews with its certificate (the
	// token is spent) and pushes the new one; nothing else changed, so
	// nothing else is sent.
	deadline := time.Now().Add(60 * time.Second)
	for {
		r = e.recv(time.Until(deadline))
		e.ack(r)
		got = secrets(t, r)
		s, ok := got[sds.DefaultName]
		if !ok {
			continue
		}
		id, next := workloadCert(t, s, servertest.LaptopID.TrustDomain(), roots)
		assert.Equal(t, servertest.LaptopID, id)
		if next.SerialNumber.Cmp(first.SerialNumber) == 0 {
			continue
		}
		assert.True(t, next.NotAfter.After(first.NotAfter), "the new certificate outlives the old")
		assert.False(t, bytes.Equal(next.RawSubjectPublicKeyInfo, first.RawSubjectPublicKeyInfo), "a new key for every certificate")
		break
	}
	require.Eventually(t, func() bool {
		// The key and the chain are two files, each replaced atomically:
		// between the two renames they do not match yet, so each poll
		// reads and verifies them together once.
		c, err := loadCreds(o.CredentialsDir, servertest.LaptopID)
		return err == nil && c.NotAfter.After(first.NotAfter)
	}, 10*time.Second, 20*time.Millisecond, "--credentials-dir follows the renewal")
}

func TestAgentExitsWhenAnSDSServerAnswers(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	rootsPEM, err := os.ReadFile(rootCert)
	require.NoError(t, err)
	o := agentFor(t, addr, rootsPEM, servertest.LaptopToken)
	startAgent(t, o)

	// The first agent's admin port, as a second agent with the same
	// --admin-listen finds it: taken. The decision comes before the
	// listener opens.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { taken.Close() })

	for _, adminListen := range []string{"", taken.Addr().String()} {
		t.Run("admin-listen="+adminListen, func(t *testing.T) {
			second := agentFor(t, addr, rootsPEM, servertest.LaptopToken)
			second.Socket = o.Socket
			second.Admin.Listen = adminListen
			var out bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := runAgent(ctx, cli.Env{In: strings.NewReader(""), Out: &out, Err: &bytes.Buffer{}, Now: time.Now}, second)
			require.NoError(t, err, "exit status 0")
			assert.Contains(t, out.String(), "already answers on "+o.Socket)
			require.NoError(t, ctx.Err(), "it returned at once instead of serving")
		})
	}
}

func TestAgentServesCredentialFiles(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	creds := filepath.Join(t.TempDir(), "creds")
	token := servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600)
	_, stderr, code := runCLI(t, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--credentials-dir", creds)
	require.Equal(t, 0, code, stderr)
	roots, err := cli.ReadPEMCerts(filepath.Join(creds, "root-cert.pem"))
	require.NoError(t, err)

	o := agent.Config{Socket: filepath.Join(t.TempDir(), "sds.sock"), CredentialsDir: creds, GraceRatio: 0.5,
		PollInterval: 50 * time.Millisecond, LogFormat: "json", LogLevel: "info"}
	startAgent(t, o)
	e := openEnvoy(t, dialSDSUnix(t, o.Socket), nil, sds.DefaultName, sds.RootCAName)
	r := e.recv(10 * time.Second)
	got := secrets(t, r)
	id, first := workloadCert(t, got[sds.DefaultName], servertest.LaptopID.TrustDomain(), roots)
	assert.Equal(t, servertest.LaptopID, id)
	sameCerts(t, roots, trustedCA(t, got[sds.RootCAName]), "ROOTCA from root-cert.pem")
	e.ack(r)

	// Renewing the files (ca request --renew) is pushed.
	_, stderr, code = runCLI(t, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--renew", "--credentials-dir", creds)
	require.Equal(t, 0, code, stderr)
	for {
		r = e.recv(10 * time.Second)
		e.ack(r)
		if s, ok := secrets(t, r)[sds.DefaultName]; ok {
			_, next := workloadCert(t, s, servertest.LaptopID.TrustDomain(), roots)
			if next.SerialNumber.Cmp(first.SerialNumber) != 0 {
				break
			}
		}
	}
}

func TestAgentFlagErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "a.test")
	rootCert := filepath.Join(dir, "root-cert.pem")
	require.NoError(t, os.WriteFile(rootCert, testca.PEM(ca.Bundle().X509Authorities()...), 0o644))
	withCA := func(o *agent.Config) {
		o.CAAddr, o.RootCert, o.TokenFile = "127.0.0.1:1", rootCert, filepath.Join(dir, "token")
	}
	withNode := func(o *agent.Config) {
		withCA(o)
		o.Node = agent.NodeConfig{Enabled: true, IdentityDefault: "istio"}
	}
	base := agent.Config{Socket: filepath.Join(dir, "sds.sock"), CredentialsDir: filepath.Join(dir, "none"),
		GraceRatio: 0.5, PollInterval: time.Second, LogFormat: "text", LogLevel: "info"}
	for _, tc := range []struct {
		name   string
		mutate func(*agent.Config)
		want   string
	}{
		{"ratio zero", func(o *agent.Config) { o.GraceRatio = 0 }, "--secret-grace-period-ratio"},
		{"ratio one", func(o *agent.Config) { o.GraceRatio = 1 }, "--secret-grace-period-ratio"},
		{"ttl fraction", func(o *agent.Config) { o.TTL = 1500 * time.Millisecond }, "--ttl"},
		{"ca without roots", func(o *agent.Config) { o.CAAddr = "127.0.0.1:1" }, "--root-cert"},
		{"roots of another trust domain", func(o *agent.Config) { withCA(o); o.TrustDomain = "b.test" },
			"--root-cert " + rootCert + " holds roots of a.test, not of b.test (--trust-domain b.test): use --trust-domain a.test, " +
				"or give b.test's roots (trustbridge bundle show -o pem on its server)"},
		{"roots of another server's trust domain", func(o *agent.Config) { withCA(o); o.ServerID = "spiffe://b.test/trustbridge/ca" },
			"--root-cert " + rootCert + " holds roots of a.test, not of b.test (--server-spiffe-id spiffe://b.test/trustbridge/ca): " +
				"use a --server-spiffe-id in a.test, or give b.test's roots (trustbridge bundle show -o pem on its server)"},
		{"nothing to serve", func(*agent.Config) {}, "--ca-addr"},
		{"node without a CA", func(o *agent.Config) { o.Node.Enabled = true }, "--node serves each workload of the node a certificate from the CA: it needs --ca-addr"},
		{"node from files", func(o *agent.Config) { withCA(o); o.Node.Enabled, o.FileMounted = true, true }, "(and not --file-mounted-certs)"},
		{"node without a token", func(o *agent.Config) { withCA(o); o.Node.Enabled, o.TokenFile = true, "" }, "--node needs --token-file"},
		{"node default", func(o *agent.Config) { withNode(o); o.Node.IdentityDefault = "spire" }, "--identity-default"},
		{"node identity map missing", func(o *agent.Config) { withNode(o); o.Node.IdentityMap = filepath.Join(dir, "absent.yaml") }, "--identity-map"},
		{"node identity map bad", func(o *agent.Config) {
			withNode(o)
			o.Node.IdentityMap = servertest.WriteFile(t, "rules:\n- name: x\n  workloads: [{namespace: shop}]\n  spiffeID: spiffe://b.test/not/ours\n", 0o644)
		}, "b.test"},
		{"node kubeconfig unreadable", func(o *agent.Config) { withNode(o); o.Node.Kubeconfig = filepath.Join(dir, "absent-kubeconfig") }, "--kubeconfig"},
		{"node without a name", func(o *agent.Config) {
			withNode(o)
			o.Node.Kubeconfig = servertest.WriteKubeconfig(t, "https://127.0.0.1:1", nil)
		}, "--node-name"},
		{"node negative bound", func(o *agent.Config) { withNode(o); o.Node.MaxIdentities = -1 }, "--max-identities"},
		{"node identity map crd without kube", func(o *agent.Config) { withNode(o); o.Node.IdentityMapCRD = true }, "--identity-map-crd needs a Kubernetes API server"},
		{"broker without node", func(o *agent.Config) { withCA(o); o.Node.BrokerSocket = filepath.Join(dir, "b.sock") }, "--broker-socket and --broker-allow need --node"},
		{"broker allows nobody", func(o *agent.Config) { withNode(o); o.Node.BrokerSocket = filepath.Join(dir, "b.sock") }, "--broker-allow: broker: no broker is allowed"},
		{"broker rule bad", func(o *agent.Config) {
			withNode(o)
			o.Node.BrokerSocket, o.Node.BrokerAllow = filepath.Join(dir, "b.sock"), []string{"sa:ztunnel"}
		}, `--broker-allow: broker: rule 1 ("sa:ztunnel"): want sa:<namespace>/<name>`},
		{"broker rules without socket", func(o *agent.Config) { withNode(o); o.Node.BrokerAllow = []string{"uid:0"} }, "need --broker-socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mutate(&o)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := runAgent(ctx, cli.Env{In: strings.NewReader(""), Out: &bytes.Buffer{}, Err: &bytes.Buffer{}, Now: time.Now}, o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.False(t, errors.Is(err, context.DeadlineExceeded))
		})
	}
}
