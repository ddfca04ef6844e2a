package istiotest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"istio.io/istio/pkg/security"
	"istio.io/istio/security/pkg/credentialfetcher/plugin"
	"istio.io/istio/security/pkg/nodeagent/cache"
	"istio.io/istio/security/pkg/nodeagent/caclient/providers/citadel"
)

const (
	trustDomain = "example.org"
	namespace   = "default"
	account     = "web"
	// The server's minimum: a published root signs 5 of these later.
	refreshHint = time.Minute
	// How long `trustbridge ca rotate`'s root may take to be published: the
	// server rechecks its state directory every 30s.
	publishWithin = 60 * time.Second
	// Activation comes 5 refresh hints after publication.
	activateWithin = 5*refreshHint + publishWithin
	// The agent's SECRET_GRACE_PERIOD_RATIO (Istio's default): it renews
	// a workload certificate when this share of its life remains.
	graceRatio = 0.5
)

// TestIstioAgentRootBundle: the ROOTCA that Istio's agent would hand Envoy,
// decoded by Istio's own cache from trustbridge's cert_chain, holds every
// root trustbridge publishes for its trust domain before a rotation, while
// the successor root is published but not yet signing, and after it signs.
// Dropping either root in the middle phase breaks every sidecar's mTLS with
// peers whose certificates the other root signed.
func TestIstioAgentRootBundle(t *testing.T) {
	bin := trustbridgeBinary(t)
	srv, agent := startAgentCA(t, bin, t.TempDir())

	before := srv.trust(t)
	require.Len(t, before.Authorities, 1, "a fresh server publishes one root")
	t.Run("before rotation", func(t *testing.T) {
		assertRootCAHolds(t, agent.fetch(t), before)
	})

	runCLI(t, bin, "ca", "rotate", "--data-dir", agent.dataDir)
	during := srv.waitTrust(t, publishWithin, "the successor root published", func(v trustView) bool {
		return len(v.Authorities) == 2
	})
	t.Run("during rotation", func(t *testing.T) {
		assertRootCAHolds(t, agent.fetch(t), during)
	})

	if testing.Short() {
		t.Skipf("-short: not waiting %v for the successor root to sign", activateWithin)
	}
	successor := during.newest(before)
	after := srv.waitTrust(t, activateWithin, "the successor root active", func(v trustView) bool {
		a, ok := v.byHash(successor)
		return ok && a.State == "active"
	})
	t.Run("after activation", func(t *testing.T) {
		require.Len(t, after.Authorities, 2, "the previous root stays published while leaves it signed live")
		got := agent.fetch(t)
		assertRootCAHolds(t, got, after)
		assertSignedBy(t, got, successor)
	})
}

// trustbridgeBinary is the binary under test, from TRUSTBRIDGE_BIN.
func trustbridgeBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("TRUSTBRIDGE_BIN")
	if bin == "" {
		if os.Getenv("TRUSTBRIDGE_ISTIO_TESTS") == "require" {
			t.Fatal("TRUSTBRIDGE_ISTIO_TESTS=require but TRUSTBRIDGE_BIN is unset: run make istio-tests")
		}
		t.Skip("TRUSTBRIDGE_BIN is unset: set it to a trustbridge binary (make build; bin/trustbridge) or run make istio-tests")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("TRUSTBRIDGE_BIN: %v", err)
	}
	// Absolute, so that a test may change directory after finding it.
	abs, err := filepath.Abs(bin)
	require.NoError(t, err)
	return abs
}

// startAgentCA starts a trustbridge server in dir that takes a bootstrap
// token as the web workload's credential, and returns it with the
// configuration of an agent presenting that token. extra are more server
// flags.
func startAgentCA(t testing.TB, bin, dir string, extra ...string) (*server, agentConfig) {
	t.Helper()
	dataDir := filepath.Join(dir, "data")
	token := "istio-agent-bootstrap-token-0123456789"
	tokenFile := filepath.Join(dir, "tokens")
	// reusable: Istio's agent presents its token on every request,
	// renewals included, as it would a service account token.
	require.NoError(t, os.WriteFile(tokenFile,
		fmt.Appendf(nil, "%s,%s,reusable\n", token, workloadID()), 0o600))
	// Istio's JWT credential plugin reads the bearer token from this file,
	// as the agent reads its projected service account token.
	jwtFile := filepath.Join(dir, "istio-token")
	require.NoError(t, os.WriteFile(jwtFile, []byte(token), 0o600))

	srv := startServer(t, bin, append([]string{
		"--trust-domain", trustDomain,
		"--data-dir", dataDir, "--init",
		"--admin-listen", "127.0.0.1:0",
		"--grpc-listen", "127.0.0.1:0",
		"--bundle-listen", "",
		"--grpc-dns-names", "localhost",
		"--bootstrap-token-file", tokenFile,
		"--bundle-refresh-hint", refreshHint.String(),
		"--log-format", "json",
	}, extra...)...)
	return srv, agentConfig{caAddr: srv.grpcAddr, jwtFile: jwtFile, dataDir: dataDir, dir: dir}
}

// workloadID is the SPIFFE ID Istio's CSR asks for and the token grants.
func workloadID() string {
	return fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, namespace, account)
}

// agentConfig is what an istio-agent is configured with: the CA address
// (CA_ADDR), the CA's root for TLS, and the token file.
type agentConfig struct {
	caAddr  string
	jwtFile string
	dataDir string
	dir     string
}

// agentSecrets is what the agent would hand Envoy over SDS.
type agentSecrets struct {
	rootCA []byte // ROOTCA's trusted CA
	chain  []byte // default's certificate chain
}

// fetch runs a fresh agent (Istio's citadel client under its secret cache)
// for default and then ROOTCA, as Envoy asks for them.
func (a agentConfig) fetch(t *testing.T) agentSecrets {
	t.Helper()
	secrets := a.secretManager(t, a.options(time.Hour))
	defer secrets.Close() // closes the CA client too

	workload, err := secrets.GenerateSecret(security.WorkloadKeyCertResourceName)
	require.NoError(t, err, "default from trustbridge through Istio's cache")
	root, err := secrets.GenerateSecret(security.RootCertReqResourceName)
	require.NoError(t, err, "ROOTCA from Istio's cache")
	return agentSecrets{rootCA: root.RootCert, chain: workload.CertificateChain}
}

// options are the agent's settings, as its environment sets them
// (CA_ADDR, ISTIOD_SAN, TRUST_DOMAIN, SECRET_TTL, SECRET_GRACE_PERIOD_RATIO).
func (a agentConfig) options(secretTTL time.Duration) *security.Options {
	return &security.Options{
		CAEndpoint: a.caAddr,
		// The agent's ISTIOD_SAN: the name the serving certificate carries
		// (--grpc-dns-names), so the client neither uses the address nor
		// rewrites localhost to istiod.istio-system.svc.
		CAEndpointSAN:                  "localhost",
		TrustDomain:                    trustDomain,
		WorkloadNamespace:              namespace,
		ServiceAccount:                 account,
		ClusterID:                      "Kubernetes",
		SecretTTL:                      secretTTL,
		SecretRotationGracePeriodRatio: graceRatio,
		ECCSigAlg:                      "ECDSA",
		WorkloadRSAKeySize:             2048,
		CredFetcher:                    plugin.CreateTokenPlugin(a.jwtFile),
	}
}

// secretManager is Istio's agent cache over its citadel CA client; the
// caller closes it, which closes the CA client too.
func (a agentConfig) secretManager(t *testing.T, opts *security.Options) *cache.SecretManagerClient {
	t.Helper()
	client, err := citadel.NewCitadelClient(opts, &citadel.TLSOptions{RootCert: a.caRootFile(t)})
	require.NoError(t, err)
	secrets, err := cache.NewSecretManagerClient(client, opts)
	require.NoError(t, err)
	return secrets
}

// caRootFile writes the CA's roots, read from its state directory as an
// operator would for the agent's CA root (root-cert.pem), to a new file.
func (a agentConfig) caRootFile(t testing.TB) string {
	t.Helper()
	pems, err := filepath.Glob(filepath.Join(a.dataDir, "ca", "roots", "*.crt.pem"))
	require.NoError(t, err)
	require.NotEmpty(t, pems, "no roots in the CA state directory")
	var all []byte
	for _, p := range pems {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		all = append(all, b...)
	}
	f, err := os.CreateTemp(a.dir, "root-cert-*.pem")
	require.NoError(t, err)
	_, err = f.Write(all)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return f.Name()
}

// assertRootCAHolds checks that ROOTCA holds exactly the roots the server
// publishes and that the workload certificate verifies against it.
func assertRootCAHolds(t *testing.T, got agentSecrets, want trustView) {
	t.Helper()
	roots := parsePEM(t, got.rootCA)
	held := map[string]bool{}
	pool := x509.NewCertPool()
	for _, c := range roots {
		sum := sha256.Sum256(c.Raw)
		held[hex.EncodeToString(sum[:])] = true
		pool.AddCert(c)
	}
	for _, a := range want.Authorities {
		assert.True(t, held[a.SHA256], "ROOTCA lacks the %s root %s (%s): Istio's agent kept %d of %d roots",
			a.State, a.ID, a.SHA256, len(roots), len(want.Authorities))
	}
	assert.Equal(t, len(want.Authorities), len(roots), "ROOTCA should hold exactly the %d published roots", len(want.Authorities))

	leaf := parseLeaf(t, got.chain)
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, workloadID(), leaf.URIs[0].String())
	assert.NoError(t, verify(t, got.chain, pool), "default does not verify against ROOTCA")
}

// assertSignedBy checks that default chains to the root with this
// fingerprint alone.
func assertSignedBy(t *testing.T, got agentSecrets, rootSHA256 string) {
	t.Helper()
	pool := x509.NewCertPool()
	for _, c := range parsePEM(t, got.rootCA) {
		if sum := sha256.Sum256(c.Raw); hex.EncodeToString(sum[:]) == rootSHA256 {
			pool.AddCert(c)
		}
	}
	assert.NoError(t, verify(t, got.chain, pool), "default is not signed by root %s", rootSHA256)
}

func parseLeaf(t *testing.T, chainPEM []byte) *x509.Certificate {
	t.Helper()
	chain := parsePEM(t, chainPEM)
	require.NotEmpty(t, chain, "default has no certificate")
	return chain[0]
}

// verify checks default's chain (leaf, then intermediates) against roots.
func verify(t *testing.T, chainPEM []byte, roots *x509.CertPool) error {
	t.Helper()
	chain := parsePEM(t, chainPEM)
	require.NotEmpty(t, chain, "default has no certificate")
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

func parsePEM(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		certs = append(certs, c)
	}
	require.Empty(t, bytes.TrimSpace(b), "trailing bytes after the PEM blocks")
	return certs
}

// trustView is the admin API's /v1/trust, the fields used here.
type trustView struct {
	Sequence    uint64      `json:"sequence"`
	Authorities []authority `json:"authorities"`
}

type authority struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	SHA256 string `json:"sha256"`
}

func (v trustView) byHash(sum string) (authority, bool) {
	for _, a := range v.Authorities {
		if a.SHA256 == sum {
			return a, true
		}
	}
	return authority{}, false
}

// newest is the fingerprint of the root in v that is not in old.
func (v trustView) newest(old trustView) string {
	for _, a := range v.Authorities {
		if _, ok := old.byHash(a.SHA256); !ok {
			return a.SHA256
		}
	}
	return ""
}

// server is a running `trustbridge server`.
type server struct {
	pid       int // for its CPU time, in a benchmark
	adminAddr string
	grpcAddr  string
	bundleURL string // when the bundle endpoint is on
}

// startServer starts the binary and reads its listeners' addresses from
// its start-up records; it is stopped (SIGTERM, then killed) when the test
// ends.
func startServer(t testing.TB, bin string, args ...string) *server {
	t.Helper()
	return startServerIn(t, bin, "", args...)
}

// startServerIn is startServer with the process in dir ("": the test's).
// It fails the test if the server writes a line that is not a JSON record.
// The server logs JSON (its --log-format auto, stderr not a terminal):
// "trustbridge server started" names its listeners, and the bundle
// endpoint's record its URL.
func startServerIn(t testing.TB, bin, dir string, args ...string) *server {
	t.Helper()
	addrs := make(chan *server, 1)
	stderr, exited := startProcess(t, "trustbridge server", bin, dir, append([]string{"server"}, args...), func(r io.Reader, pid int) {
		readStartRecords(r, &server{pid: pid}, addrs)
	})
	select {
	case s := <-addrs:
		return s
	case <-exited:
		t.Fatalf("trustbridge server %v exited; stderr:\n%s", args, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("no start-up records naming the admin and gRPC listeners within 30s; stderr:\n%s", stderr.String())
	}
	return nil
}

// startRecord is what the start-up records say of the listeners.
type startRecord struct {
	Msg       string            `json:"msg"`
	Listeners map[string]string `json:"listeners"`
	URL       string            `json:"endpoint_url"`
}

// readStartRecords fills s from the JSON log lines of r and sends it on
// ready once it has the admin and gRPC addresses and, with a bundle
// endpoint, its URL; then it reads r to its end.
func readStartRecords(r io.Reader, s *server, ready chan<- *server) {
	sent, wantBundle := false, false
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec startRecord
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		switch rec.Msg {
		case "trustbridge server started":
			s.adminAddr, s.grpcAddr = rec.Listeners["admin"], rec.Listeners["grpc"]
			wantBundle = rec.Listeners["bundle"] != ""
		case "bundle endpoint: peers federate with this tuple":
			s.bundleURL = rec.URL
		}
		if !sent && s.adminAddr != "" && s.grpcAddr != "" && (!wantBundle || s.bundleURL != "") {
			ready <- s
			sent = true
		}
	}
}

// trust reads /v1/trust.
func (s *server) trust(t *testing.T) trustView {
	t.Helper()
	v, err := s.getTrust()
	require.NoError(t, err)
	return v
}

func (s *server) getTrust() (trustView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.adminAddr+"/v1/trust", nil)
	if err != nil {
		return trustView{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return trustView{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return trustView{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return trustView{}, fmt.Errorf("/v1/trust: %s: %s", resp.Status, body)
	}
	var v trustView
	if err := json.Unmarshal(body, &v); err != nil {
		return trustView{}, fmt.Errorf("/v1/trust: %w", err)
	}
	return v, nil
}

// waitTrust polls /v1/trust until cond holds, failing after within.
func (s *server) waitTrust(t *testing.T, within time.Duration, what string, cond func(trustView) bool) trustView {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last trustView
	var lastErr error
	for {
		last, lastErr = s.getTrust()
		if lastErr == nil && cond(last) {
			return last
		}
		select {
		case <-deadline.C:
			t.Fatalf("waiting for %s: not within %v; last /v1/trust %+v, error %v", what, within, last, lastErr)
		case <-tick.C:
		}
	}
}

// runCLI runs a trustbridge command to completion, bounded in time.
func runCLI(t *testing.T, bin string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	require.NoError(t, err, "trustbridge %s: %s", strings.Join(args, " "), out)
}
