package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// launchReloadable runs a server with o whose SIGHUP is the returned
// channel, and returns its admin address and live log.
func launchReloadable(t *testing.T, o Config) (admin string, hup chan<- os.Signal, logs *testlog.Buffer) {
	t.Helper()
	e, _, logs := testEnv(t, o.LogFormat)
	ch := make(chan os.Signal, 1)
	e.hup = ch
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runServer(ctx, e, o, ready) }()
	select {
	case admin = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("server exited: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done, "clean shutdown")
	})
	return admin, ch, logs
}

// SIGHUP reloads the federation file: a good one is applied at once, a
// bad one leaves the endpoints in force and says why; the bootstrap token
// file is re-read now.
func TestServerSIGHUPReloads(t *testing.T) {
	dir := t.TempDir()
	fedFile := filepath.Join(dir, "federation.yaml")
	require.NoError(t, os.WriteFile(fedFile, []byte(servertest.WebPeers("a.example")), 0o600))
	tokens := filepath.Join(dir, "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(servertest.LaptopToken+","+servertest.LaptopID.String()+"\n"), 0o600))
	o := baseServerOptions("example.org", t.TempDir())
	o.Federation.ConfigFile = fedFile
	o.Federation.AllowPrivate = true
	o.GRPC = GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: TokenReviewOff}
	admin, hup, logs := launchReloadable(t, o)
	require.Equal(t, []string{"a.example"}, servertest.Federated(t, admin))

	require.NoError(t, os.WriteFile(fedFile, []byte(servertest.WebPeers("a.example", "b.example")), 0o600))
	require.NoError(t, os.WriteFile(tokens, []byte(servertest.LaptopToken+","+servertest.LaptopID.String()+"\nsecond-token-0123456789abcdef,spiffe://example.org/vm/b\n"), 0o600))
	servertest.HUPAndWait(t, hup, logs, "reloaded", 2)
	assert.Equal(t, []string{"a.example", "b.example"}, servertest.Federated(t, admin), "applied without a restart")
	assert.Contains(t, logs.String(), `"part":"federation","applied":"2 federated trust domains from flags and files"`)
	assert.Contains(t, logs.String(), `"part":"bootstrap tokens","applied":"2 tokens in force"`)
	assert.Equal(t, 3, servertest.CountRecords(logs.String(), "federated trust domain configured"), "a at start, a and b after the reload")

	require.NoError(t, os.WriteFile(fedFile, []byte("federation:\n  - trustDomain: c.example\n    bundleEndpointURL: http://c.example/\n"), 0o600))
	servertest.HUPAndWait(t, hup, logs, "reload failed; the previous configuration stays in force", 1)
	assert.Equal(t, []string{"a.example", "b.example"}, servertest.Federated(t, admin), "the last good endpoints stay")
	assert.Contains(t, logs.String(), fedFile, "the error names the file")
}

// Without anything reloadable, SIGHUP is logged and ignored: the server
// keeps serving.
func TestServerSIGHUPIgnoredWithNothingToReload(t *testing.T) {
	admin, hup, logs := launchReloadable(t, baseServerOptions("example.org", t.TempDir()))
	servertest.HUPAndWait(t, hup, logs, "SIGHUP ignored: nothing here is reloadable", 1)
	code, _ := servertest.Get(t, "http://"+admin+"/healthz")
	assert.Equal(t, http.StatusOK, code)
}

// SIGHUP re-reads the bundle endpoint's --bundle-file files now, and a bad
// one is reported while its last good bundle stays served.
func TestServerSIGHUPRereadsBundleFiles(t *testing.T) {
	dir := t.TempDir()
	peer := testca.New(t, "peer.example")
	doc, err := bundledoc.Marshal(peer.Bundle())
	require.NoError(t, err)
	peerFile := filepath.Join(dir, "peer.json")
	require.NoError(t, os.WriteFile(peerFile, doc, 0o600))
	o := baseServerOptions("example.org", t.TempDir())
	o.Bundle = BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, Files: []string{"peer.example=" + peerFile}, ServeOthers: true}
	_, hup, logs := launchReloadable(t, o)

	servertest.HUPAndWait(t, hup, logs, "reloaded", 1)
	assert.Contains(t, logs.String(), `"part":"--bundle-file `+peerFile+`"`)

	require.NoError(t, os.WriteFile(peerFile, []byte(`{"keys": [`), 0o600))
	servertest.HUPAndWait(t, hup, logs, "reload failed; the previous configuration stays in force", 1)
	rec := servertest.LogRecord(logs.String(), "reload failed; the previous configuration stays in force")
	assert.Equal(t, "--bundle-file "+peerFile, rec["part"])
}
