package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// trustbridge healthcheck exits 0 for a ready server, found on its admin
// socket or at --admin, and 1 with the server's reason when it is not
// ready, or with why it could not be asked.
func TestHealthcheckServer(t *testing.T) {
	dir := t.TempDir()
	o := flagServerOptions(t, "--trust-domain", "example.org", "--data-dir", dir, "--init", "--admin-listen", "127.0.0.1:0", "--log-format", "json")
	admin, _, stop := launchServer(t, o)
	assert.Equal(t, "server is ready\n", mustCLI(t, "healthcheck", "--data-dir", dir))
	assert.Equal(t, "server is live\n", mustCLI(t, "healthcheck", "--shallow", "--admin", "http://"+admin))
	stop()

	_, stderr, code := runCLIAt(t, time.Now, "", "healthcheck", "--admin", "http://"+admin)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "server is not ready: ")
	assert.Contains(t, stderr, "connection refused")

	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		http.Error(w, "not ready: ca: the upstream authority refuses: 403", http.StatusServiceUnavailable)
	}))
	t.Cleanup(notReady.Close)
	_, stderr, code = runCLIAt(t, time.Now, "", "healthcheck", "--admin", notReady.URL)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "server is not ready: ca: the upstream authority refuses: 403 (503 Service Unavailable)")
	assert.Equal(t, "server is live\n", mustCLI(t, "healthcheck", "--shallow", "--admin", notReady.URL))
}

// trustbridge agent healthcheck asks the agent's SDS socket: live when it
// accepts a connection, ready when it serves the workload's certificate;
// or the agent's admin listener with --admin.
func TestHealthcheckAgent(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	creds := filepath.Join(t.TempDir(), "creds")
	token := servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600)
	mustCLI(t, "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--credentials-dir", creds)

	sock := filepath.Join(t.TempDir(), "sds.sock")
	_, stderr, code := runCLIAt(t, time.Now, "", "agent", "healthcheck", "--sds-socket", sock, "--shallow")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "agent is not live: --sds-socket: ")

	adminAddr := servertest.ReservePort(t)
	o := agent.Config{Socket: sock, CredentialsDir: creds, GraceRatio: 0.5, PollInterval: time.Second,
		LogFormat: "json", LogLevel: "info", Admin: agent.AdminConfig{Listen: adminAddr}}
	startAgent(t, o)
	assert.Equal(t, "agent is live\n", mustCLI(t, "agent", "healthcheck", "--sds-socket", sock, "--shallow"))
	assert.Equal(t, "agent is ready\n", mustCLI(t, "agent", "healthcheck", "--sds-socket", sock))
	// The SDS socket served the certificate: /readyz says ready too.
	assert.Equal(t, "agent is ready\n", mustCLI(t, "agent", "healthcheck", "--admin", "http://"+adminAddr))
	assert.Equal(t, "agent is live\n", mustCLI(t, "agent", "healthcheck", "--admin", "http://"+adminAddr, "--shallow"))
}
