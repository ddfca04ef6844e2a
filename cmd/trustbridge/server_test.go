package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// launchServer runs runServer with o until the returned stop (or the end
// of the test) and returns the admin address and what it wrote until it
// served: the start-up records (logRecord), after the banner when o logs
// text.
func launchServer(t *testing.T, o server.Config) (admin, banner string, stop func()) {
	t.Helper()
	e, out, logs := testEnv(t, o.LogFormat)
	admin, stop = servertest.Launch(t, o.TrustDomain, logs, func(ctx context.Context, ready chan<- string) error {
		return runServer(ctx, e, o, ready)
	})
	return admin, out.String() + logs.String(), stop
}

// baseServerOptions is a server for td on dataDir with the defaults of the
// flags and loopback listeners; the bundle endpoint is off.
func baseServerOptions(td, dataDir string) server.Config {
	return server.Config{
		TrustDomain: td, DataDir: dataDir, AdminListen: "127.0.0.1:0",
		KeyType: "ec-p256", CATTL: 8760 * time.Hour, WorkloadTTL: 24 * time.Hour,
		MaxWorkloadTTL: 90 * 24 * time.Hour, RefreshHint: 5 * time.Minute, LogFormat: "json", LogLevel: "info",
		Federation: server.FederationConfig{MinRefresh: federation.DefaultMinRefresh, MaxRefresh: federation.DefaultMaxRefresh,
			Timeout: 5 * time.Second},
	}
}

func startServer(t *testing.T, dataDir string, mutate ...func(*server.Config)) (string, *bytes.Buffer) {
	t.Helper()
	o := baseServerOptions("example.org", dataDir)
	for _, m := range mutate {
		m(&o)
	}
	admin, banner, _ := launchServer(t, o)
	return admin, bytes.NewBufferString(banner)
}

func TestServerRequiresTrustDomain(t *testing.T) {
	t.Setenv("TRUST_DOMAIN", "")
	_, stderr, code := runCLI(t, "", "server", "--data-dir", t.TempDir(), "--admin-listen", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--trust-domain (or TRUST_DOMAIN) is required")

	_, stderr, code = runCLI(t, "", "server", "--trust-domain", "Example.org", "--data-dir", t.TempDir(), "--admin-listen", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `--trust-domain "Example.org"`)
}

func TestServerRefusesCorruptState(t *testing.T) {
	dataDir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dataDir, "ca"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "ca", "state.json"), []byte("{"), 0o600))
	_, stderr, code := runCLI(t, "", "server", "--trust-domain", "example.org", "--data-dir", dataDir, "--admin-listen", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "corrupt CA state")
}

// A data dir of another trust domain is sound state found by a wrong
// flag: the refusal names both trust domains and both fixes, not
// corruption.
func TestServerRefusesOtherTrustDomainState(t *testing.T) {
	dataDir := t.TempDir()
	_, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("a.example"), DataDir: dataDir})
	require.NoError(t, err)
	_, stderr, code := runCLI(t, "", "server", "--trust-domain", "b.example", "--data-dir", dataDir, "--admin-listen", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Equal(t, "trustbridge: data dir "+dataDir+" holds the CA of trust domain a.example; this server was started with --trust-domain b.example: "+
		"use --trust-domain a.example, or another --data-dir\n", stderr)
}

func TestCAIssueWhileServerRuns(t *testing.T) {
	dataDir := t.TempDir()
	startServer(t, dataDir)
	out := filepath.Join(t.TempDir(), "creds")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", dataDir, "--spiffe-id", "spiffe://example.org/demo", "--credentials-dir", out, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "issued spiffe://example.org/demo")

	info, err := os.Stat(filepath.Join(out, "key.pem"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	chainPEM, err := os.ReadFile(filepath.Join(out, "cert-chain.pem"))
	require.NoError(t, err)
	rootPEM, err := os.ReadFile(filepath.Join(out, "root-cert.pem"))
	require.NoError(t, err)
	var raw [][]byte
	for rest := chainPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		raw = append(raw, b.Bytes)
	}
	roots, err := x509bundle.Parse(spiffeid.RequireTrustDomainFromString("example.org"), rootPEM)
	require.NoError(t, err)
	id, _, err := x509svid.ParseAndVerify(raw, roots)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/demo", id.String())

	if _, err := exec.LookPath("openssl"); err == nil {
		cmd := exec.Command("openssl", "verify", "-CAfile", filepath.Join(out, "root-cert.pem"), filepath.Join(out, "cert-chain.pem"))
		outb, err := cmd.CombinedOutput()
		assert.NoError(t, err, "openssl verify: %s", outb)
	} else {
		t.Log("openssl not installed; skipping openssl verify")
	}

	t.Run("--out, the old name of --credentials-dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "old")
		_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", dataDir, "--spiffe-id", "spiffe://example.org/demo", "--out", dir)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stderr, "--out is deprecated")
		assert.FileExists(t, filepath.Join(dir, "key.pem"))
		_, stderr, code = runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", dataDir, "--spiffe-id", "spiffe://example.org/demo", "--out", dir, "--credentials-dir", t.TempDir())
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "pass only --credentials-dir")
	})
	t.Run("refuses other trust domains", func(t *testing.T) {
		_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", dataDir, "--spiffe-id", "spiffe://other.org/demo", "--credentials-dir", t.TempDir())
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "other.org")
	})
	t.Run("refuses TTL over the maximum", func(t *testing.T) {
		_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", dataDir, "--spiffe-id", "spiffe://example.org/demo", "--credentials-dir", t.TempDir(), "--ttl", "2160h1s")
		assert.Equal(t, 1, code)
		assert.NotEmpty(t, stderr)
	})
	t.Run("no state", func(t *testing.T) {
		empty := t.TempDir()
		_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", empty, "--spiffe-id", "spiffe://example.org/demo", "--credentials-dir", t.TempDir())
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "no CA state")
	})
}

func TestCARotate(t *testing.T) {
	dataDir := t.TempDir()
	_, out := startServer(t, dataDir)
	_ = out
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", dataDir)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "prepared root ")
	stdout, _, code = runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", dataDir)
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "already prepared and waiting")

	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", filepath.Join(t.TempDir(), "typo"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "no CA state")
}

// writeCACerts writes an Istio cacerts directory: root → signing CA.
func writeCACerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := testca.New(t, "example.org", testca.Options{NotAfter: time.Now().Add(48 * time.Hour)})
	key := testca.NewKey(t, testca.ECP256)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "signing CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	signing := testca.Sign(t, tmpl, root.Cert, key.Public(), root.Key)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	for name, data := range map[string][]byte{
		"ca-cert.pem":    cli.CertsPEM([]*x509.Certificate{signing}),
		"ca-key.pem":     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		"cert-chain.pem": cli.CertsPEM([]*x509.Certificate{signing, root.Cert}),
		"root-cert.pem":  cli.CertsPEM([]*x509.Certificate{root.Cert}),
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
	return dir
}

func TestServerPluginCA(t *testing.T) {
	caDir := writeCACerts(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	o := server.Config{
		TrustDomain: "example.org", DataDir: t.TempDir(), AdminListen: "127.0.0.1:0", KeyType: "ec-p256",
		CATTL: 8760 * time.Hour, WorkloadTTL: time.Hour, MaxWorkloadTTL: 24 * time.Hour, RefreshHint: 5 * time.Minute,
		CADir: caDir, CADirPoll: time.Hour, LogFormat: "json", LogLevel: "info",
	}
	e, _, logs := testEnv(t, o.LogFormat)
	go func() {
		done <- runServer(ctx, e, o, ready)
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("server exited: %v\n%s", err, logs.String())
	}
	assert.Equal(t, "plug-in CA from "+caDir+" (reloaded on change)", servertest.LogAttr(t, logs.String(), "trustbridge server started", "ca"))
	_, body := servertest.Get(t, "http://"+addr+"/v1/trust")
	var doc servertest.TrustDoc
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	require.Len(t, doc.Authorities, 1)
	assert.Equal(t, "external", doc.Authorities[0].State)
	code, _ := servertest.Get(t, "http://"+addr+"/readyz")
	assert.Equal(t, http.StatusOK, code)
	cancel()
	require.NoError(t, <-done)

	creds := t.TempDir()
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--ca-dir", caDir, "--spiffe-id", "spiffe://example.org/vm", "--credentials-dir", creds, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	chain, err := os.ReadFile(filepath.Join(creds, "cert-chain.pem"))
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(string(chain), "BEGIN CERTIFICATE"), "leaf and the signing CA")
}
