package istiotest

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"istio.io/istio/pilot/cmd/pilot-agent/options"
	"istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/envoy"
	istioagent "istio.io/istio/pkg/istio-agent"
	"istio.io/istio/pkg/security"
	"istio.io/istio/security/pkg/nodeagent/cache"
	"istio.io/istio/security/pkg/nodeagent/caclient/providers/citadel"
)

// The guide's local steps use these ports; the test swaps in free ones.
const (
	docGRPCPort  = "15012"
	docAdminPort = "15014"
	// agentProcessOut, when set, makes TestIstioDocAgentProcess run as the
	// Istio agent and write what it got into that directory.
	agentProcessOut = "TRUSTBRIDGE_ISTIO_DOC_AGENT_OUT"
)

// TestIstioDocLocal runs the guide's "Try it locally" blocks as written
// (ports swapped for free ones) and hands the environment they export to
// Istio's own agent code in a process of its own, since pilot-agent reads
// its environment once, at start: its option parsing, FindRootCAForCA,
// the citadel client and the secret cache must get the workload
// certificate, signed by the root the guide wrote to root-cert.pem.
func TestIstioDocLocal(t *testing.T) {
	bin := trustbridgeBinary(t)
	blocks := readDocBlocks(t)
	dir := docDir(t)
	path := binOnPath(t, bin)

	runShell(t, dir, path, block(t, blocks, "local-setup", "sh").body)
	work := filepath.Join(dir, "tb-istio")
	srv := startDocServer(t, bin, work, block(t, blocks, "local-server", "sh"))

	ports := strings.NewReplacer(":"+docGRPCPort, ":"+portOf(t, srv.grpcAddr), ":"+docAdminPort, ":"+portOf(t, srv.adminAddr))
	agentBlock := block(t, blocks, "local-agent", "sh").body
	env := exportedEnv(t, dir, path, ports.Replace(agentBlock))
	for _, name := range []string{"CA_ADDR", "CA_ROOT_CA", "TRUST_DOMAIN"} {
		require.Contains(t, env, name, "the local-agent block exports no %s", name)
	}

	got := runIstioAgent(t, work, env)
	rootFile, err := os.ReadFile(env["CA_ROOT_CA"])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(rootFile), "CA_ROOT_CA holds no PEM certificate")
	leaf := parseLeaf(t, got.chain)
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, "spiffe://example.org/ns/default/sa/web", leaf.URIs[0].String())
	assert.NoError(t, verify(t, got.chain, pool), "the workload certificate does not chain to the guide's root-cert.pem")
	assertRootCAHolds(t, got, srv.trust(t))

	t.Run("local-verify", func(t *testing.T) {
		for _, line := range commandLines(ports.Replace(block(t, blocks, "local-verify", "sh").body)) {
			runShell(t, work, path, line)
		}
	})
}

// TestIstioDocAgentProcess is the Istio agent of TestIstioDocLocal, run by
// it in a process whose environment is the guide's.
func TestIstioDocAgentProcess(t *testing.T) {
	out := os.Getenv(agentProcessOut)
	if out == "" {
		t.Skip("run by TestIstioDocLocal, in a process with the guide's environment")
	}
	// As pilot-agent does (pilot/cmd/pilot-agent/app/cmd.go), without Envoy.
	proxyConfig := mesh.DefaultProxyConfig()
	secOpts, err := options.NewSecurityOptions(proxyConfig, 0, "")
	require.NoError(t, err)
	proxyArgs := options.NewProxyArgs()
	agent := istioagent.NewAgent(proxyConfig, options.NewAgentOptions(&proxyArgs, proxyConfig, nil), secOpts, envoy.ProxyConfig{})
	// The citadel provider's own steps (pkg/istio-agent/plugins.go).
	root, err := agent.FindRootCAForCA()
	require.NoError(t, err, "Istio's agent finds no root for the CA connection")
	key, cert := agent.GetKeyCertsForCA()
	client, err := citadel.NewCitadelClient(secOpts, &citadel.TLSOptions{RootCert: root, Key: key, Cert: cert})
	require.NoError(t, err)
	secrets, err := cache.NewSecretManagerClient(client, secOpts)
	require.NoError(t, err)
	defer secrets.Close()
	workload, err := secrets.GenerateSecret(security.WorkloadKeyCertResourceName)
	require.NoError(t, err, "default from trustbridge through Istio's agent, configured by the guide's environment")
	rootCA, err := secrets.GenerateSecret(security.RootCertReqResourceName)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(out, "cert-chain.pem"), workload.CertificateChain, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(out, "ROOTCA.pem"), rootCA.RootCert, 0o600))
}

// runIstioAgent runs TestIstioDocAgentProcess in dir with env only (and
// PATH, HOME, TMPDIR) and returns what the agent got.
func runIstioAgent(t *testing.T, dir string, env map[string]string) agentSecrets {
	t.Helper()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestIstioDocAgentProcess$", "-test.count", "1", "-test.v")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(), agentProcessOut + "=" + out}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "Istio's agent with the guide's environment %v:\n%s", env, b)
	require.NotContains(t, string(b), "--- SKIP", "the agent process skipped:\n%s", b)
	chain, err := os.ReadFile(filepath.Join(out, "cert-chain.pem"))
	require.NoError(t, err)
	root, err := os.ReadFile(filepath.Join(out, "ROOTCA.pem"))
	require.NoError(t, err)
	return agentSecrets{chain: chain, rootCA: root}
}

// binOnPath returns a PATH on which "trustbridge" is bin, as the guide
// calls it.
func binOnPath(t *testing.T, bin string) string {
	t.Helper()
	d := t.TempDir()
	require.NoError(t, os.Symlink(bin, filepath.Join(d, "trustbridge")))
	return d + string(os.PathListSeparator) + os.Getenv("PATH")
}

// runShell runs script with bash -e in dir, bounded in time.
func runShell(t *testing.T, dir, path, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "the guide's commands failed:\n%s\noutput:\n%s", script, out.String())
	return out.String()
}

var exportLine = regexp.MustCompile(`^export\s+(.*)$`)

// exportedEnv runs script and returns the values of the variables its
// export lines name, as the shell holds them afterwards.
func exportedEnv(t *testing.T, dir, path, script string) map[string]string {
	t.Helper()
	var names []string
	for _, line := range commandLines(script) {
		m := exportLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, w := range shellWords(t, m[1]) {
			name, _, ok := strings.Cut(w, "=")
			require.True(t, ok, "export %q without a value", w)
			names = append(names, name)
		}
	}
	require.NotEmpty(t, names, "the block exports nothing")
	var dump strings.Builder
	dump.WriteString(script)
	for _, n := range names {
		fmt.Fprintf(&dump, "\nprintf '%%s=%%s\\0' %s \"${%s}\"", n, n)
	}
	out := runShell(t, dir, path, dump.String())
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(out, "\x00"), "\x00") {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, "unexpected output %q", out)
		env[k] = v
	}
	return env
}

// startDocServer runs the block's one trustbridge server command in dir,
// with the guide's ports swapped for free ones.
func startDocServer(t *testing.T, bin, dir string, b docBlock) *server {
	t.Helper()
	lines := commandLines(b.body)
	require.Len(t, lines, 1, "%s:%d: block %q should hold one command", istioDoc, b.line, b.name)
	words := shellWords(t, lines[0])
	require.GreaterOrEqual(t, len(words), 2)
	require.Equal(t, []string{"trustbridge", "server"}, words[:2], "%s:%d", istioDoc, b.line)
	args := make([]string, 0, len(words)-2)
	for _, w := range words[2:] {
		w = strings.Replace(w, "127.0.0.1:"+docGRPCPort, "127.0.0.1:0", 1)
		w = strings.Replace(w, "127.0.0.1:"+docAdminPort, "127.0.0.1:0", 1)
		args = append(args, w)
	}
	return startServerIn(t, bin, dir, args...)
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return port
}
