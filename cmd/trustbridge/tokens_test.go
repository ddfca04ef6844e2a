package main

import (
	"crypto/sha256"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

var tokenNow = time.Date(2026, 11, 24, 9, 30, 15, 500, time.UTC)

func TestTokenCreate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.csv")
	at := func() time.Time { return tokenNow }

	stdout, stderr, code := runCLIAt(t, at, "", "token", "create", "--spiffe-id", servertest.LaptopID.String(), "--file", file)
	require.Equal(t, 0, code, stderr)
	token := strings.TrimSuffix(stdout, "\n")
	require.Len(t, token, 43, "stdout is the token alone: %q", stdout)
	ref := authn.BootstrapGrantRef(sha256.Sum256([]byte(token)))
	assert.Equal(t, "added to "+file+": a single-use token for "+servertest.LaptopID.String()+", expiring 2026-11-24T10:30:15Z (reference "+ref+")\n", stderr)
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, token+","+servertest.LaptopID.String()+",expires=2026-11-24T10:30:15Z\n", string(data))
	info, err := os.Stat(file)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	stdout, stderr, code = runCLIAt(t, at, "", "token", "create", "--spiffe-id", "spiffe://example.org/lab/demo", "--ttl", "0", "--reusable", "--file", file)
	require.Equal(t, 0, code, stderr)
	second := strings.TrimSuffix(stdout, "\n")
	assert.NotEqual(t, token, second)
	assert.Contains(t, stderr, "a reusable token for spiffe://example.org/lab/demo, never expiring")
	data, err = os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, token+","+servertest.LaptopID.String()+",expires=2026-11-24T10:30:15Z\n"+second+",spiffe://example.org/lab/demo,reusable\n", string(data))
	b, err := authn.LoadBootstrapTokens(file, servertest.LaptopID.TrustDomain())
	require.NoError(t, err, "the server loads what token create wrote")
	assert.Equal(t, 2, b.Len())

	// Without --file, the line is printed for a file kept elsewhere.
	stdout, stderr, code = runCLIAt(t, at, "", "token", "create", "--spiffe-id", servertest.LaptopID.String(), "--ttl", "10m")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `^[A-Za-z0-9_-]{43},spiffe://example.org/vm/laptop,expires=2026-11-24T09:40:15Z\n$`, stdout)
	assert.Empty(t, stderr)
}

func TestTokenCreateRefusals(t *testing.T) {
	other := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(other, []byte(servertest.LaptopToken+",spiffe://other.example/vm/a\n"), 0o600))
	for _, tc := range []struct {
		name   string
		args   []string
		errHas string
	}{
		{"no identity", nil, "--spiffe-id is required"},
		{"not a SPIFFE ID", []string{"--spiffe-id", "https://example.org/a"}, `--spiffe-id "https://example.org/a"`},
		{"no path", []string{"--spiffe-id", "spiffe://example.org"}, "has no path; a workload ID needs one"},
		{"negative TTL", []string{"--spiffe-id", servertest.LaptopID.String(), "--ttl", "-1h"}, "--ttl -1h0m0s: want a whole number of seconds"},
		{"fractional TTL", []string{"--spiffe-id", servertest.LaptopID.String(), "--ttl", "1.5s"}, "--ttl 1.5s"},
		{"file of another trust domain", []string{"--spiffe-id", servertest.LaptopID.String(), "--file", other}, "does not load for trust domain example.org"},
		{"file in a missing directory", []string{"--spiffe-id", servertest.LaptopID.String(), "--file", filepath.Join(t.TempDir(), "no", "tokens.csv")}, "--file:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "", append([]string{"token", "create"}, tc.args...)...)
			assert.Equal(t, 1, code)
			assert.Empty(t, stdout, "no token is handed out when none was added")
			assert.Contains(t, stderr, tc.errHas)
			assert.NotContains(t, stderr, servertest.LaptopToken)
		})
	}
	data, err := os.ReadFile(other)
	require.NoError(t, err)
	assert.Equal(t, servertest.LaptopToken+",spiffe://other.example/vm/a\n", string(data), "a refused file is left alone")
}

// tokenServer is a server with the certificate service and the token file
// tokens on dataDir; stop ends it.
type tokenServer struct {
	admin, addr, rootCert string
	stop                  func()
}

func startTokenServer(t *testing.T, dataDir, tokens string) tokenServer {
	t.Helper()
	o := baseServerOptions("example.org", dataDir)
	o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
	admin, banner, stop := launchServer(t, o)
	_, roots, err := ca.NewStore(dataDir).Load("example.org")
	require.NoError(t, err)
	var certs []*x509.Certificate
	for _, r := range roots {
		certs = append(certs, r.Cert)
	}
	return tokenServer{admin: admin, addr: servertest.GRPCAddr(t, banner), rootCert: servertest.WriteFile(t, string(cli.CertsPEM(certs)), 0o644), stop: stop}
}

// request runs ca request with the token in tokenFile (or, with certDir,
// the certificate there) and returns the exit status and stderr.
func (s tokenServer) request(t *testing.T, auth, value string, extra ...string) (int, string, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "creds")
	_, stderr, code := runCLIAt(t, time.Now, "", append([]string{"ca", "request", "--ca-addr", s.addr, "--root-cert", s.rootCert,
		auth, value, "--credentials-dir", out}, extra...)...)
	return code, stderr, out
}

func (s tokenServer) metric(t *testing.T, line string) {
	t.Helper()
	_, body := servertest.Get(t, "http://"+s.admin+"/metrics")
	assert.Contains(t, body, line)
}

// TestBootstrapTokenLifecycle is issue 21 item 4 end to end, with the CLI
// an operator and a laptop use: a token from token create buys one
// certificate, which renews itself; the token's second use is refused
// Unauthenticated and counted, before and after a restart; a request the
// server refuses does not consume a token; an expired token is refused and
// counted; a reusable one works again and again.
func TestBootstrapTokenLifecycle(t *testing.T) {
	dataDir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	create := func(now time.Time, args ...string) string {
		t.Helper()
		stdout, stderr, code := runCLIAt(t, func() time.Time { return now }, "", append([]string{"token", "create", "--file", tokens}, args...)...)
		require.Equal(t, 0, code, stderr)
		return servertest.WriteFile(t, stdout, 0o600)
	}
	laptop := create(time.Now(), "--spiffe-id", servertest.LaptopID.String(), "--ttl", "1h")
	expired := create(time.Now().Add(-2*time.Hour), "--spiffe-id", servertest.LaptopID.String(), "--ttl", "1h")
	lab := create(time.Now(), "--spiffe-id", "spiffe://example.org/lab/demo", "--reusable")
	srv := startTokenServer(t, dataDir, tokens)

	// A request the server refuses (another identity than the token's)
	// buys nothing and leaves the token usable.
	code, stderr, _ := srv.request(t, "--token-file", laptop, "--spiffe-id", "spiffe://example.org/vm/desktop")
	require.Equal(t, 1, code)
	assert.Contains(t, stderr, "refused to issue this identity")

	code, stderr, creds := srv.request(t, "--token-file", laptop)
	require.Equal(t, 0, code, stderr)
	checkCreds(t, creds, servertest.LaptopID)

	code, stderr, _ = srv.request(t, "--token-file", laptop)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "did not accept the credentials (token or certificate): the bootstrap token was already used: it is single-use")
	srv.metric(t, `trustbridge_authn_bootstrap_token_refusals_total{reason="consumed",trust_domain="example.org"} 1`)
	srv.metric(t, `trustbridge_authn_bootstrap_token_consumptions_total{result="consumed",trust_domain="example.org"} 1`)

	// Renewal is by the certificate (mTLS), never the token: it works
	// after the token is consumed.
	code, stderr, renewed := srv.request(t, "--prov-cert", creds)
	require.Equal(t, 0, code, stderr)
	checkCreds(t, renewed, servertest.LaptopID)

	code, stderr, _ = srv.request(t, "--token-file", expired)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the bootstrap token expired")
	srv.metric(t, `trustbridge_authn_bootstrap_token_refusals_total{reason="expired",trust_domain="example.org"} 1`)

	for range 3 {
		code, stderr, _ := srv.request(t, "--token-file", lab)
		require.Equal(t, 0, code, stderr)
	}

	// A restart remembers the consumption (the ledger in the data
	// directory), and holds no token.
	srv.stop()
	ledger, err := os.ReadFile(filepath.Join(dataDir, authn.LedgerFileName))
	require.NoError(t, err)
	token, err := os.ReadFile(laptop)
	require.NoError(t, err)
	assert.NotContains(t, string(ledger), strings.TrimSpace(string(token)))
	info, err := os.Stat(filepath.Join(dataDir, authn.LedgerFileName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	srv = startTokenServer(t, dataDir, tokens)
	code, stderr, _ = srv.request(t, "--token-file", laptop)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "already used")
	srv.metric(t, `trustbridge_authn_bootstrap_token_refusals_total{reason="consumed",trust_domain="example.org"} 1`)
	code, stderr, _ = srv.request(t, "--prov-cert", renewed)
	require.Equal(t, 0, code, "renewal still works after the restart: %s", stderr)
	code, stderr, _ = srv.request(t, "--token-file", lab)
	require.Equal(t, 0, code, stderr)
}

// TestSDSRefusesSingleUseToken: SDS cannot spend a token on one
// certificate (a stream mints and re-authenticates for as long as it
// lasts), so it refuses single-use tokens, and accepts the certificate
// such a token bought.
func TestSDSRefusesSingleUseToken(t *testing.T) {
	tokens := servertest.WriteTokenFile(t, servertest.LaptopToken+","+servertest.LaptopID.String()+"\n")
	srv := startTokenServer(t, t.TempDir(), tokens)
	roots, err := cli.ReadPEMCerts(srv.rootCert)
	require.NoError(t, err)

	e := openEnvoy(t, dialSDSTLS(t, srv.addr, servertest.LaptopID.TrustDomain(), roots, servertest.LaptopToken), nil, "ROOTCA")
	select {
	case r := <-e.resps:
		t.Fatalf("SDS answered a single-use token: %v", r)
	case err := <-e.errs:
		assert.Contains(t, err.Error(), "Unauthenticated")
	case <-t.Context().Done():
		t.Fatal("the SDS stream was neither refused nor answered")
	}
	// ca request buys the certificate with the token, then fetches trust
	// from SDS with that certificate.
	code, stderr, creds := srv.request(t, "--token-file", servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600))
	require.Equal(t, 0, code, stderr)
	checkCreds(t, creds, servertest.LaptopID)
}
