package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/agentapi"
	jwtcmd "github.com/trustbridge/trustbridge/cmd/trustbridge/cli/jwt"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/svid"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// workloadToolsServer is east.example with a certificate service, a
// bootstrap token for eastWorkload, an admin socket, and an agent serving
// the Workload API: what the workload tooling of issue 36 talks to.
func workloadToolsServer(t *testing.T) (s *e2eServer, apiAddr, adminSock string) {
	t.Helper()
	adminSock = filepath.Join(t.TempDir(), "admin.sock")
	tokens := servertest.WriteTokenFile(t, eastToken+","+eastWorkload.String()+",reusable\n")
	s = startE2EServer(t, "east.example", t.TempDir(), func(o *server.Config) {
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff, DNSNames: []string{"trustbridge.east.example"}}
		o.AdminSocket = adminSock
	})
	return s, workloadAgent(t, s, eastToken), adminSock
}

// `agent api fetch|validate` against a real agent's Workload API, checked
// with go-spiffe's own client (issue 36, item 9).
func TestAgentAPIE2E(t *testing.T) {
	s, addr, _ := workloadToolsServer(t)
	sock := strings.TrimPrefix(addr, "unix://")
	const aud = "https://api.example.com"

	// fetch x509, by --socket-path: the SVID go-spiffe gets too.
	var x agentapi.X509Output
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "agent", "api", "fetch", "x509", "--socket-path", sock, "-o", "json")), &x))
	require.Len(t, x.SVIDs, 1)
	assert.Equal(t, eastWorkload.String(), x.SVIDs[0].SPIFFEID)
	require.NotEmpty(t, x.SVIDs[0].Chain)
	assert.Equal(t, []agentapi.BundleOutput{{TrustDomain: "east.example", X509: ptr(1)}}, x.Bundles)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr(addr))
	require.NoError(t, err)
	assert.Equal(t, want.Certificates[0].NotAfter.UTC(), x.SVIDs[0].ExpiresAt)

	// By SPIFFE_ENDPOINT_SOCKET, as a table, writing the files.
	t.Setenv(workloadapi.SocketEnv, addr)
	dir := filepath.Join(t.TempDir(), "svids")
	table := mustCLI(t, "agent", "api", "fetch", "x509", "--write", dir)
	assert.Contains(t, table, "SVID 0: "+eastWorkload.String())
	assert.Regexp(t, `east\.example\s+1\s+-`, table)
	assert.Contains(t, table, "wrote "+filepath.Join(dir, "svid.0.key"))
	fileSVID, err := x509svid.Load(filepath.Join(dir, "svid.0.pem"), filepath.Join(dir, "svid.0.key"))
	require.NoError(t, err)
	roots, err := x509bundle.Load(s.td, filepath.Join(dir, "bundle.0.pem"))
	require.NoError(t, err)
	_, _, err = x509svid.Verify(fileSVID.Certificates, roots)
	require.NoError(t, err, "the written SVID verifies against the written bundle")
	assert.Equal(t, eastWorkload, fileSVID.ID)
	assertMode(t, filepath.Join(dir, "svid.0.key"), 0o600)

	// fetch jwt, then validate it: by go-spiffe offline and by the agent.
	var j agentapi.JWTOutput
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "agent", "api", "fetch", "jwt", "--audience", aud, "-o", "json")), &j))
	require.Len(t, j.SVIDs, 1)
	bundles, err := workloadapi.NewBundleSource(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(addr)))
	require.NoError(t, err)
	defer bundles.Close()
	parsed, err := jwtsvid.ParseAndValidate(j.SVIDs[0].Token, bundles, []string{aud})
	require.NoError(t, err)
	assert.Equal(t, eastWorkload, parsed.ID)
	require.Len(t, j.Bundles, 1)
	assert.Positive(t, *j.Bundles[0].JWT)

	stdout, stderr, code := runCLIAt(t, time.Now, j.SVIDs[0].Token+"\n", "agent", "api", "validate", "jwt", "--audience", aud, "-")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "spiffe id:  "+eastWorkload.String())
	_, stderr, code = runCLIAt(t, time.Now, j.SVIDs[0].Token, "agent", "api", "validate", "jwt", "--audience", "https://other.example", "-")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "refuses the token for audience https://other.example")

	var b agentapi.BundlesOutput
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "agent", "api", "fetch", "bundles", "-o", "json")), &b))
	require.Len(t, b.Bundles, 1)
	assert.Equal(t, 1, *b.Bundles[0].X509)
	assert.Equal(t, *j.Bundles[0].JWT, *b.Bundles[0].JWT)

	// Nobody on the socket: said so, with where to point it.
	_, stderr, code = runCLIAt(t, time.Now, "", "agent", "api", "fetch", "x509", "--socket-path", filepath.Join(t.TempDir(), "none.sock"), "--timeout", "5s")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "is not reachable")
	assert.Contains(t, stderr, "SPIFFE_ENDPOINT_SOCKET")
}

func ptr(n int) *int { return &n }

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, want, fi.Mode().Perm(), path)
}

// activeSigned is what s's active X.509 authority signed that is live.
func activeSigned(t *testing.T, s *e2eServer) int {
	t.Helper()
	a := activeAuthority(t, s, false)
	require.NotNil(t, a.Signed)
	return a.Signed.Live
}

// `x509 mint` and `jwt mint --spiffe-id` as an operator on the admin API:
// verified with go-spiffe against `bundle show`, audited with who asked,
// counted; another trust domain's ID and a caller without the token are
// refused (issue 36, item 9).
func TestMintE2E(t *testing.T) {
	s, addr, adminSock := workloadToolsServer(t)
	auth := []string{"--admin", s.admin, "--data-dir", s.dataDir}
	probe := spiffeid.RequireFromString("spiffe://east.example/ops/probe")
	signedBefore := activeSigned(t, s)

	dir := filepath.Join(t.TempDir(), "probe")
	out := mustCLI(t, append([]string{"x509", "mint", "--spiffe-id", probe.String(), "--dns", "probe.example.org", "--ttl", "1h", "--write", dir}, auth...)...)
	assert.Contains(t, out, "minted X509-SVID "+probe.String())
	assertMode(t, filepath.Join(dir, "key.pem"), 0o600)
	chain, err := os.ReadFile(filepath.Join(dir, "svid.pem"))
	require.NoError(t, err)
	certs, err := cli.ParsePEMCerts(chain)
	require.NoError(t, err)
	ders := make([][]byte, len(certs))
	for i, c := range certs {
		ders[i] = c.Raw
	}
	shown, err := cli.ParsePEMCerts([]byte(mustCLI(t, "bundle", "show", "-o", "pem", "--data-dir", s.dataDir)))
	require.NoError(t, err)
	minted, _, err := x509svid.ParseAndVerify(ders, x509bundle.FromX509Authorities(s.td, shown))
	require.NoError(t, err, "the minted SVID verifies against bundle show")
	assert.Equal(t, probe, minted)
	assert.Equal(t, []string{"probe.example.org"}, certs[0].DNSNames)
	assert.WithinDuration(t, time.Now().Add(time.Hour), certs[0].NotAfter, 2*time.Minute)
	keyed, err := x509svid.Load(filepath.Join(dir, "svid.pem"), filepath.Join(dir, "key.pem"))
	require.NoError(t, err, "the key written is the certificate's")
	assert.Equal(t, probe, keyed.ID)
	assert.Equal(t, signedBefore+1, activeSigned(t, s), "counted in the issuance ledger")

	// Over the admin socket, as JSON with the key; the TTL clamped.
	stdout, stderr, code := runCLIAt(t, time.Now, "", "x509", "mint", "--spiffe-id", probe.String(), "--ttl", "8760h", "-o", "json", "--admin", "unix://"+adminSock)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "warning: lifetime 8760h0m0s clamped to the server's maximum")
	var x svid.X509Output
	require.NoError(t, json.Unmarshal([]byte(stdout), &x))
	assert.Contains(t, x.PrivateKey, "BEGIN PRIVATE KEY")

	// jwt mint --spiffe-id, validated by the agent's Workload API.
	token := strings.TrimSpace(mustCLI(t, append([]string{"jwt", "mint", "--spiffe-id", probe.String(), "--audience", "https://api.example.com"}, auth...)...))
	stdout, stderr, code = runCLIAt(t, time.Now, token, "agent", "api", "validate", "jwt", "--socket-path", addr, "--audience", "https://api.example.com", "-o", "json", "-")
	require.Equal(t, 0, code, stderr)
	var v jwtcmd.ValidateOutput
	require.NoError(t, json.Unmarshal([]byte(stdout), &v))
	assert.Equal(t, probe.String(), v.SPIFFEID)

	wrong := servertest.WriteFile(t, "not-the-admin-token\n", 0o600)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"another trust domain", append([]string{"x509", "mint", "--spiffe-id", "spiffe://west.example/ops/probe"}, auth...), "this server signs for east.example only"},
		{"another trust domain, jwt", append([]string{"jwt", "mint", "--spiffe-id", "spiffe://west.example/a", "--audience", "a"}, auth...), "this server signs for east.example only"},
		{"the bundle endpoint's ID", append([]string{"x509", "mint", "--spiffe-id", "spiffe://east.example/trustbridge/bundle-endpoint"}, auth...), "is this server's own identity"},
		{"the certificate service's ID, jwt", append([]string{"jwt", "mint", "--spiffe-id", "spiffe://east.example/trustbridge/ca", "--audience", "a"}, auth...), "is this server's own identity"},
		{"under the server's own path", append([]string{"jwt", "mint", "--spiffe-id", "spiffe://east.example/trustbridge/agent", "--audience", "a"}, auth...), "the server keeps spiffe://east.example/trustbridge/* for itself"},
		{"the certificate service's DNS name", append([]string{"x509", "mint", "--spiffe-id", probe.String(), "--dns", "*.east.example"}, auth...), `dns_names "*.east.example": trustbridge.east.example is a host name this server serves under`},
		{"not the admin", []string{"x509", "mint", "--spiffe-id", probe.String(), "--admin", s.admin, "--admin-token-file", wrong}, "401 Unauthorized: wrong admin token"},
		{"not the admin, jwt", []string{"jwt", "mint", "--spiffe-id", probe.String(), "--audience", "a", "--admin", s.admin, "--admin-token-file", wrong}, "wrong admin token"},
		{"both paths", []string{"jwt", "mint", "--spiffe-id", probe.String(), "--audience", "a", "--ca-addr", "127.0.0.1:1", "--token-file", wrong}, "--ca-addr, --token-file are for minting your own identity"},
		{"admin flag without --spiffe-id", []string{"jwt", "mint", "--audience", "a", "--admin", s.admin}, "--admin is for minting on the admin API, which --spiffe-id ID selects"},
		{"no --spiffe-id", append([]string{"x509", "mint"}, auth...), "--spiffe-id is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runCLIAt(t, time.Now, "", tc.args...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tc.want)
		})
	}

	var events []string
	for _, e := range servertest.ReadAuditLog(t, s.dataDir) {
		if strings.HasSuffix(e.Event, "_svid_minted") {
			events = append(events, e.Event+": "+e.Reason)
		}
	}
	require.Len(t, events, 3, "refusals are not minted")
	assert.Contains(t, events[0], "x509_svid_minted: X509-SVID "+probe.String()+" (serial ")
	assert.Contains(t, events[0], "DNS probe.example.org) minted by admin-token (admin API)")
	assert.Contains(t, events[1], "minted by admin-socket (admin API)")
	assert.Contains(t, events[2], "jwt_svid_minted: JWT-SVID "+probe.String()+" for audience https://api.example.com")
	assert.NotContains(t, events[2], token)
	stdout, stderr, code = runCLIAt(t, time.Now, "", "audit", "log", "verify", filepath.Join(s.dataDir, "audit.jsonl"))
	assert.Equal(t, 0, code, stdout+stderr)
}

// The commands docs/operations.md shows for minting and for the
// Workload API client exist and take the flags shown.
func TestDocsWorkloadToolsCommands(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	require.NoError(t, err)
	doc := string(data)
	start, end := strings.Index(doc, "## Minting SVIDs as an operator"), strings.Index(doc, "## Reloading (SIGHUP)")
	require.True(t, start >= 0 && end > start, "the sections are where this test looks")
	var lines []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(doc[start:end], -1) {
		lines = append(lines, exampleCommands(block[1])...)
	}
	require.Len(t, lines, 7)
	root := newRootCmd(cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Now: time.Now})
	for _, l := range lines {
		cmd, rest, err := root.Find(shellWords(l)[1:])
		require.NoError(t, err, l)
		require.NotEqual(t, root, cmd, "%s: no such command", l)
		assert.NoError(t, cmd.ParseFlags(rest), l)
	}
}
