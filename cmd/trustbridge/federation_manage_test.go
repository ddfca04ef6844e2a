package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// mustCLI runs the CLI with the real clock and requires success.
func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, code := runCLIAt(t, time.Now, "", args...)
	require.Equal(t, 0, code, "trustbridge %v: %s", args, stderr)
	return stdout
}

func relationships(t *testing.T, s *e2eServer) map[string]api.Relationship {
	t.Helper()
	var rels []api.Relationship
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "federation", "list", "-o", "json", "--admin", s.admin)), &rels))
	out := map[string]api.Relationship{}
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
	require.NoError(t, os.WriteFile(peerPEM, []byte(mustCLI(t, "bundle", "show", "-o", "pem", "--data-dir", peerDir)), 0o600))

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
		assert.Contains(t, stderr, filepath.Join(dir, server.AdminTokenName))
		_, ok := federationStatus(t, local, "peer.example")
		assert.False(t, ok, "nothing added")
	})

	assert.Contains(t, mustCLI(t, add...), "federated with peer.example")
	waitFederated(t, local, "peer.example", 0, 30*time.Second)
	assert.Equal(t, api.Relationship{TrustDomain: "peer.example", Origin: server.OriginRuntime, EndpointURL: peer.bundleURL, Profile: "https_spiffe",
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
	assert.Equal(t, server.OriginRuntime, servertest.LogAttr(t, local.banner, "federated trust domain configured", "origin"),
		"the start-up records list the peers added at run time too")
	waitFederated(t, local, "peer.example", 0, 30*time.Second)
	assert.Equal(t, server.OriginRuntime, relationships(t, local)["peer.example"].Origin)

	assert.Contains(t, mustCLI(t, "federation", "remove", "peer.example", "--admin", local.admin, "--data-dir", dir), "removed peer.example")
	_, ok := federationStatus(t, local, "peer.example")
	assert.False(t, ok)
	assert.NoFileExists(t, filepath.Join(dir, "federation-managed.yaml"))
	stored, err := federation.NewLKGStore(dir).Load(spiffeid.RequireTrustDomainFromString("peer.example"))
	require.NoError(t, err)
	assert.Nil(t, stored, "removing a peer deletes its stored bundle: adding it again starts from the new --bundle, not the old roots")

	var seen []string
	for _, e := range servertest.ReadAuditLog(t, dir) {
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
	assert.Equal(t, api.Relationship{TrustDomain: "static.example", Origin: api.OriginStatic}, relationships(t, local)["static.example"])

	_, stderr, code = set("example.org", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "bundle is for another trust domain") // checked before sending
	own := filepath.Join(t.TempDir(), "own.pem")
	require.NoError(t, os.WriteFile(own, []byte(mustCLI(t, "bundle", "show", "-o", "pem", "--data-dir", dir)), 0o600))
	_, stderr, code = set("example.org", own)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "this server's own trust domain")

	local.stop()
	local = startE2EServer(t, "example.org", dir, nil)
	assert.Equal(t, api.OriginStatic, relationships(t, local)["static.example"].Origin)
	code, body := servertest.Get(t, local.admin+"/v1/snapshot")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"static.example"`)

	// bundle show from the data dir, while the server runs, is what the
	// server publishes.
	shown := mustCLI(t, "bundle", "show", "-o", "spiffe", "--data-dir", dir)
	code, served := servertest.Get(t, local.admin+"/v1/bundle")
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, served, shown)
	assert.JSONEq(t, served, mustCLI(t, "bundle", "show", "-o", "spiffe", "--admin", local.admin))
	b, _, err := bundledoc.ParsePEM(local.td, []byte(mustCLI(t, "bundle", "show", "-o", "pem", "--admin", local.admin)))
	require.NoError(t, err)
	assert.NotEmpty(t, b.X509Authorities())
	assert.Contains(t, mustCLI(t, "bundle", "show", "--data-dir", dir), "example.org")
}

// writeTemp writes content to a file of its own and returns its path.
func writeTemp(t *testing.T, content string) string {
	t.Helper()
	return servertest.WriteFile(t, content, 0o600)
}

// An add that fails keeps the last good state and says how to fix it: a
// peer that does not answer (unless --no-fetch), a bundle file that is not
// a CA's; a run-time file corrupted while the server was stopped stops the
// next start, naming the file, as a bad --federation-config does.
func TestFederationAddFailuresKeepState(t *testing.T) {
	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, nil)
	down := "https://" + servertest.ReservePort(t) + "/"
	run := func(args ...string) (string, string, int) {
		return runCLIAt(t, time.Now, "", append(args, "--admin", local.admin, "--data-dir", dir)...)
	}
	peer := testca.New(t, "peer.example")
	leaf, _ := peer.Issue(t, spiffeid.RequireFromString("spiffe://peer.example/w"))
	leafPEM := writeTemp(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})))
	rootPEM := writeTemp(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: peer.Cert.Raw})))
	spiffeAdd := []string{"federation", "add", "peer.example", down, "--endpoint-spiffe-id", "spiffe://peer.example/s"}
	garbage := writeTemp(t, "garbage\n")
	jwtOnly := writeTemp(t, `{"keys": []}`)

	tests := []struct {
		name string
		args []string
		msg  []string
	}{
		{"peer down", append(slices.Clone(spiffeAdd), "--bundle", rootPEM), []string{"502 Bad Gateway", "first fetch failed", "nothing was changed", "--no-fetch"}},
		{"leaf as bundle", append(slices.Clone(spiffeAdd), "--bundle", leafPEM), []string{"trustbridge: --bundle " + leafPEM + ": PEM certificate 1 (): x5c certificate is not a CA"}},
		{"no bundle", spiffeAdd, []string{"400 Bad Request: no bundle of peer.example held to authenticate the first fetch from its endpoint spiffe://peer.example/s: " +
			"give peer.example's bundle with --bundle FILE, the file its operator makes with " +
			"`trustbridge bundle show -o spiffe > peer.example.json` (or `spire-server bundle show -format spiffe`) and sends you over a channel you trust\n"}},
		{"garbage bundle", append(slices.Clone(spiffeAdd), "--bundle", garbage), []string{"trustbridge: --bundle " + garbage +
			": invalid JSON at offset 0: invalid character 'g' looking for beginning of value; " +
			"give peer.example's bundle as its operator prints it with trustbridge bundle show -o spiffe (or -o pem)\n"}},
		{"bundle without X.509 roots", append(slices.Clone(spiffeAdd), "--bundle", jwtOnly), []string{"trustbridge: --bundle " + jwtOnly +
			": bootstrap bundle has no X.509 authorities, so it could never authenticate the first fetch from self-serving endpoint spiffe://peer.example/s; " +
			"give peer.example's bundle as its operator prints it with trustbridge bundle show -o spiffe (or -o pem)\n"}},
		{"our own", []string{"federation", "add", "example.org", down}, []string{"own trust domain"}},
		{"not https", []string{"federation", "add", "web.example", "http://web.example/"}, []string{"400 Bad Request: bundleEndpointURL \"http://web.example/\": scheme must be https\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := run(tt.args...)
			assert.Equal(t, 1, code)
			for _, m := range tt.msg {
				assert.Contains(t, stderr, m)
			}
			for _, internal := range []string{"federation[0]", "trustDomainBundle", "bundledoc"} {
				assert.NotContains(t, stderr, internal, "a name the user never wrote")
			}
			assert.Empty(t, relationships(t, local))
			assert.NoFileExists(t, filepath.Join(dir, "federation-managed.yaml"))
		})
	}

	// --no-fetch adds the peer that is down: it is polled until it answers.
	stdout, stderr, code := run(append(slices.Clone(spiffeAdd), "--bundle", rootPEM, "--no-fetch")...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "federated with peer.example")
	assert.Equal(t, server.OriginRuntime, relationships(t, local)["peer.example"].Origin)
	local.stop()

	path := filepath.Join(dir, "federation-managed.yaml")
	require.NoError(t, os.WriteFile(path, []byte("federation:\n  - trustDomian: peer.example\n"), 0o600))
	o := baseServerOptions("example.org", dir)
	var logs bytes.Buffer
	err := runServer(context.Background(), cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: &logs, Now: time.Now}, o, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run-time federation")
	assert.Contains(t, err.Error(), "federation-managed.yaml")
	assert.Contains(t, err.Error(), `unknown key "trustDomian"`)
}

// Over --admin-socket (mode 0600) changes need no token: the socket's
// owner is the server's user. The audit log names the socket as actor.
func TestFederationAddOverAdminSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	local := startE2EServer(t, "example.org", dir, func(o *server.Config) { o.AdminSocket = sock })
	info, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	static := testca.New(t, "static.example")
	file := writeTemp(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: static.Cert.Raw})))
	noToken := filepath.Join(t.TempDir(), "none")
	out := mustCLI(t, "bundle", "set", "static.example", file, "--admin", "unix://"+sock, "--admin-token-file", noToken)
	assert.Contains(t, out, "static bundle")
	assert.Contains(t, mustCLI(t, "federation", "add", "web.example", "https://"+servertest.ReservePort(t)+"/", "--no-fetch", "--admin", "unix://"+sock, "--admin-token-file", noToken), "federated with web.example")
	assert.Equal(t, server.OriginRuntime, relationships(t, local)["web.example"].Origin)

	// Every admin command takes unix://PATH, the reading ones too.
	sockAdmin := []string{"--admin", "unix://" + sock}
	assert.Contains(t, mustCLI(t, append([]string{"federation", "status", "--fail-on-error=false"}, sockAdmin...)...), "web.example")
	assert.Contains(t, mustCLI(t, append([]string{"audit", "--fail-on", "none"}, sockAdmin...)...), "trust domain example.org")
	_, stderr, code := runCLIAt(t, time.Now, "", append([]string{"federation", "refresh", "nope.example"}, sockAdmin...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `trust domain "nope.example" is not federated`, "the server answered")

	var reasons []string
	for _, e := range servertest.ReadAuditLog(t, dir) {
		if e.Event == "static_bundle_set" || e.Event == "federation_added" {
			reasons = append(reasons, e.Event+" "+e.Reason)
		}
	}
	assert.Equal(t, []string{"static_bundle_set by admin-socket (admin API)", "federation_added by admin-socket (admin API)"}, reasons)
	local.stop()
	assert.NoFileExists(t, sock, "removed at stop")
}

// A SIGHUP reload that would configure, in a file, a trust domain added
// at run time is refused, saying how to move it; the endpoints in force
// stay.
func TestReloadRefusesARunTimeTrustDomain(t *testing.T) {
	dir := t.TempDir()
	fedFile := filepath.Join(t.TempDir(), "federation.yaml")
	require.NoError(t, os.WriteFile(fedFile, []byte(servertest.WebPeers("a.example")), 0o600))
	o := baseServerOptions("example.org", dir)
	o.Federation.ConfigFile = fedFile
	o.Federation.AllowPrivate = true
	admin, hup, logs := launchReloadable(t, o)
	mustCLI(t, "federation", "add", "b.example", "https://127.0.0.1:1/b", "--no-fetch", "--admin", "http://"+admin, "--data-dir", dir)
	require.Equal(t, []string{"a.example", "b.example"}, servertest.Federated(t, admin))

	require.NoError(t, os.WriteFile(fedFile, []byte(servertest.WebPeers("a.example", "b.example")), 0o600))
	servertest.HUPAndWait(t, hup, logs, "reload failed; the previous configuration stays in force", 1)
	assert.Contains(t, logs.String(), "b.example has an endpoint set at run time: remove it with trustbridge federation remove b.example")
	assert.Equal(t, []string{"a.example", "b.example"}, servertest.Federated(t, admin))

	// Moved: removed at run time, then reloaded from the file.
	mustCLI(t, "federation", "remove", "b.example", "--admin", "http://"+admin, "--data-dir", dir)
	servertest.HUPAndWait(t, hup, logs, "reloaded", 1)
	assert.Equal(t, []string{"a.example", "b.example"}, servertest.Federated(t, admin))
	_, stderr, code := runCLIAt(t, time.Now, "", "federation", "remove", "b.example", "--admin", "http://"+admin, "--data-dir", dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "b.example is configured by --federation-config")

	// A static bundle set at run time is refused by a reload too: both
	// sources would be trusted, and the static one could not be removed.
	c := testca.New(t, "c.example")
	pemFile := filepath.Join(t.TempDir(), "c.pem")
	require.NoError(t, os.WriteFile(pemFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw}), 0o600))
	mustCLI(t, "bundle", "set", "c.example", pemFile, "--admin", "http://"+admin, "--data-dir", dir)
	require.NoError(t, os.WriteFile(fedFile, []byte(servertest.WebPeers("a.example", "b.example", "c.example")), 0o600))
	servertest.HUPAndWait(t, hup, logs, "reload failed; the previous configuration stays in force", 2)
	assert.Contains(t, logs.String(), "c.example has a static bundle set at run time: remove it with trustbridge federation remove c.example")
	assert.Equal(t, []string{"a.example", "b.example"}, servertest.Federated(t, admin))
}

// The admin token goes over https, plain http to loopback, or the admin
// socket, nowhere else.
func TestTokenTransportOK(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"http://127.0.0.1:15014", true},
		{"http://127.9.8.7:15014/", true},
		{"http://[::1]:15014", true},
		{"http://localhost:15014", true},
		{"http://LocalHost:15014", true},
		{"https://trustbridge.example:15014", true},
		{"http://10.0.0.5:15014", false},
		{"http://0.0.0.0:15014", false},
		{"http://trustbridge.trustbridge.svc:15014", false},
		{"http://localhost.attacker.example:15014", false},
		{"http://127.0.0.1.attacker.example:15014", false},
		{"ftp://127.0.0.1:15014", false},
		{"127.0.0.1:15014", false},
		{"http://%zz", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			err := cli.TokenTransportOK(tc.addr)
			if tc.ok {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "--admin")
		})
	}
}

// The admin client uses no proxy: HTTP_PROXY would see the token.
func TestAdminClientNoProxy(t *testing.T) {
	for _, addr := range []string{"http://127.0.0.1:15014", "https://trustbridge.example", "unix:///run/admin.sock"} {
		client, _ := (&cli.AdminClient{Addr: addr}).Client()
		tr, ok := client.Transport.(*http.Transport)
		require.True(t, ok, addr)
		assert.Nil(t, tr.Proxy, addr)
		assert.NotNil(t, client.CheckRedirect, "%s: redirects are not followed", addr)
	}
}

// A mutation to a non-loopback http address is refused before anything is
// sent: the server (reachable here as 0.0.0.0, which Linux routes to
// loopback) never sees the token, and the error says what to do.
func TestAdminTokenNotSentInClearText(t *testing.T) {
	tokenFile := writeTemp(t, "s3cret\n")
	var (
		mu  sync.Mutex
		got []string
	)
	seen := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = io.WriteString(w, "removed\n")
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	_, stderr, code := runCLIAt(t, time.Now, "", "federation", "remove", "peer.example",
		"--admin", fmt.Sprintf("http://0.0.0.0:%d", port), "--admin-token-file", tokenFile)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "refusing to send the admin token in clear text")
	assert.Contains(t, stderr, "--admin-socket")
	assert.Contains(t, stderr, "port-forward")
	assert.Empty(t, seen(), "nothing reached the server")

	// The same server over loopback gets it.
	out := mustCLI(t, "federation", "remove", "peer.example", "--admin", srv.URL, "--admin-token-file", tokenFile)
	assert.Equal(t, "removed\n", out)
	assert.Equal(t, []string{"Bearer s3cret"}, seen())
}
