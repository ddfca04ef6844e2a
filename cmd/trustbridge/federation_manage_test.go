package main

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/admin"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testca"
)

// cli runs the CLI with the real clock and requires success.
func cli(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, code := runCLIAt(t, time.Now, "", args...)
	require.Equal(t, 0, code, "trustbridge %v: %s", args, stderr)
	return stdout
}

func relationships(t *testing.T, s *e2eServer) map[string]admin.Relationship {
	t.Helper()
	var rels []admin.Relationship
	require.NoError(t, json.Unmarshal([]byte(cli(t, "federation", "list", "-o", "json", "--admin", s.admin)), &rels))
	out := map[string]admin.Relationship{}
	for _, r := range rels {
		out[r.TrustDomain] = r
	}
	return out
}

// federation add against a running server, with the peer's PEM roots
// (bundle show -o pem on the peer's data dir) as the bootstrap bundle:
// fetched without a restart, kept across one, removed, audited (issue 22).
func TestFederationAddRemoveAtRunTime(t *testing.T) {
	peerDir := t.TempDir()
	peer := startE2EServer(t, "peer.example", peerDir, nil)
	peerPEM := filepath.Join(t.TempDir(), "peer.pem")
	require.NoError(t, os.WriteFile(peerPEM, []byte(cli(t, "bundle", "show", "-o", "pem", "--data-dir", peerDir)), 0o600))

	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, nil)
	add := []string{"federation", "add", "peer.example", peer.bundleURL, "--endpoint-spiffe-id", "spiffe://peer.example/trustbridge/bundle-endpoint",
		"--bundle", peerPEM, "--admin", local.admin, "--data-dir", dir}

	t.Run("without the token", func(t *testing.T) {
		_, stderr, code := runCLIAt(t, time.Now, "", append(add[:len(add)-2:len(add)-2], "--admin-token-file", filepath.Join(t.TempDir(), "none"))...)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "admin token:")
		wrong := filepath.Join(t.TempDir(), "wrong")
		require.NoError(t, os.WriteFile(wrong, []byte("nope\n"), 0o600))
		_, stderr, code = runCLIAt(t, time.Now, "", append(add[:len(add)-2:len(add)-2], "--admin-token-file", wrong)...)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "401 Unauthorized: wrong admin token")
		assert.Contains(t, stderr, filepath.Join(dir, adminTokenName))
		_, ok := federationStatus(t, local, "peer.example")
		assert.False(t, ok, "nothing added")
	})

	assert.Contains(t, cli(t, add...), "federated with peer.example")
	waitFederated(t, local, "peer.example", 0, 30*time.Second)
	assert.Equal(t, admin.Relationship{TrustDomain: "peer.example", Origin: originRuntime, EndpointURL: peer.bundleURL, Profile: "https_spiffe",
		EndpointSPIFFEID: "spiffe://peer.example/trustbridge/bundle-endpoint", State: "ok"}, relationships(t, local)["peer.example"])

	_, stderr, code := runCLIAt(t, time.Now, "", add...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "409 Conflict")
	assert.Contains(t, stderr, "--force")

	info, err := os.Stat(filepath.Join(dir, "federation-managed.yaml"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// A restart keeps it.
	local.stop()
	local = startE2EServer(t, "example.org", dir, nil)
	waitFederated(t, local, "peer.example", 0, 30*time.Second)
	assert.Equal(t, originRuntime, relationships(t, local)["peer.example"].Origin)

	assert.Contains(t, cli(t, "federation", "remove", "peer.example", "--admin", local.admin, "--data-dir", dir), "removed peer.example")
	_, ok := federationStatus(t, local, "peer.example")
	assert.False(t, ok)
	assert.NoFileExists(t, filepath.Join(dir, "federation-managed.yaml"))

	var seen []string
	for _, e := range readAuditLog(t, dir) {
		if e.Event == "federation_added" || e.Event == "federation_removed" {
			seen = append(seen, e.Event+" "+e.TrustDomain+" "+e.Reason)
		}
	}
	assert.Equal(t, []string{"federation_added peer.example by admin-token (admin API)", "federation_removed peer.example by admin-token (admin API)"}, seen)
	stdout, stderr, code := runCLIAt(t, time.Now, "", "audit", "log", "verify", filepath.Join(dir, "audit.jsonl"))
	assert.Equal(t, 0, code, stdout+stderr)
}

// bundle set with PEM roots: a static bundle, trusted at once, listed,
// kept across a restart; refused for our own trust domain and for one
// naming another trust domain.
func TestBundleSetPEMAndShow(t *testing.T) {
	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, nil)
	static := testca.New(t, "static.example")
	file := filepath.Join(t.TempDir(), "root-cert.pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: static.Cert.Raw}), 0o600))
	set := func(td, f string) (string, string, int) {
		return runCLIAt(t, time.Now, "", "bundle", "set", td, f, "--admin", local.admin, "--data-dir", dir)
	}

	stdout, stderr, code := set("static.example", file)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "set static.example's static bundle (trusted as is): 1 X.509")
	assert.Equal(t, admin.Relationship{TrustDomain: "static.example", Origin: admin.OriginStatic}, relationships(t, local)["static.example"])

	_, stderr, code = set("example.org", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "bundle is for another trust domain") // checked before sending
	own := filepath.Join(t.TempDir(), "own.pem")
	require.NoError(t, os.WriteFile(own, []byte(cli(t, "bundle", "show", "-o", "pem", "--data-dir", dir)), 0o600))
	_, stderr, code = set("example.org", own)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "this server's own trust domain")

	local.stop()
	local = startE2EServer(t, "example.org", dir, nil)
	assert.Equal(t, admin.OriginStatic, relationships(t, local)["static.example"].Origin)
	code, body := get(t, local.admin+"/v1/snapshot")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"static.example"`)

	// bundle show from the data dir, while the server runs, is what the
	// server publishes.
	shown := cli(t, "bundle", "show", "-o", "spiffe", "--data-dir", dir)
	code, served := get(t, local.admin+"/v1/bundle")
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, served, shown)
	assert.JSONEq(t, served, cli(t, "bundle", "show", "-o", "spiffe", "--admin", local.admin))
	b, _, err := bundledoc.ParsePEM(local.td, []byte(cli(t, "bundle", "show", "-o", "pem", "--admin", local.admin)))
	require.NoError(t, err)
	assert.NotEmpty(t, b.X509Authorities())
	assert.Contains(t, cli(t, "bundle", "show", "--data-dir", dir), "example.org")
}

// writeTemp writes content to a file of its own and returns its path.
func writeTemp(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}
