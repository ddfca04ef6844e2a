package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// flagServerOptions is the server of these command-line flags, with every
// other flag at its default (the admin socket's included).
func flagServerOptions(t *testing.T, args ...string) server.Config {
	t.Helper()
	var o server.Config
	f := pflag.NewFlagSet("server", pflag.ContinueOnError)
	o.AddFlags(f)
	require.NoError(t, f.Parse(args))
	require.NoError(t, o.Load(f, func(string) string { return "" }))
	return o
}

// By default the server serves its admin API on <data-dir>/admin.sock,
// mode 0600, and the CLI finds it there: a change needs no --admin and no
// token, only --data-dir, and nothing at all from the directory holding
// ./data (make run, then trustbridge federation add in the same place).
// The audit log names the socket as who asked.
func TestAdminSocketByDefault(t *testing.T) {
	base, err := os.MkdirTemp("", "sock")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "data")
	o := flagServerOptions(t, "--trust-domain", "example.org", "--data-dir", dir, "--init", "--admin-listen", "127.0.0.1:0", "--log-format", "json")
	admin, banner, stop := launchServer(t, o)
	sock := filepath.Join(dir, server.AdminSocketName)
	info, err := os.Lstat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, info.Mode().Type())
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	assert.Equal(t, sock, servertest.LogAttr(t, banner, "trustbridge server started", "admin_socket"))

	// No token anywhere the CLI would look: the socket is the authority.
	require.NoError(t, os.Remove(filepath.Join(dir, server.AdminTokenName)))
	t.Setenv("TRUSTBRIDGE_ADMIN_TOKEN_FILE", "")
	out := mustCLI(t, "federation", "add", "web.example", "https://"+servertest.ReservePort(t)+"/", "--no-fetch", "--data-dir", dir)
	assert.Contains(t, out, "federated with web.example")
	t.Chdir(base)
	assert.Contains(t, mustCLI(t, "federation", "remove", "web.example"), "web.example")
	assert.NotContains(t, mustCLI(t, "federation", "list", "--admin", "http://"+admin), "web.example")

	// An explicit --admin is used as given: TCP wants the token.
	_, stderr, code := runCLIAt(t, time.Now, "", "federation", "add", "web.example", "https://127.0.0.1:1/", "--no-fetch", "--admin", "http://"+admin)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "admin token")

	var reasons []string
	for _, e := range servertest.ReadAuditLog(t, dir) {
		if e.Event == "federation_added" || e.Event == "federation_removed" {
			reasons = append(reasons, e.Event+" "+e.Reason)
		}
	}
	assert.Equal(t, []string{"federation_added by admin-socket (admin API)", "federation_removed by admin-socket (admin API)"}, reasons)
	stop()
	assert.NoFileExists(t, sock, "removed at stop")
}

// trustbridge log level reads the running server's level and changes it
// until the next restart: over the admin socket with --data-dir, or at
// --admin with the token; each change is in the audit log.
func TestLogLevelCommand(t *testing.T) {
	dir := t.TempDir()
	o := flagServerOptions(t, "--trust-domain", "example.org", "--data-dir", dir, "--init", "--admin-listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "warn")
	admin, _, _ := launchServer(t, o)
	assert.Equal(t, "warn\n", mustCLI(t, "log", "level", "--admin", "http://"+admin))
	assert.Equal(t, "log level debug (was warn)\n", mustCLI(t, "log", "level", "debug", "--data-dir", dir))
	assert.Equal(t, "log level info (was debug)\n", mustCLI(t, "log", "level", "info", "--admin", "http://"+admin, "--data-dir", dir))
	assert.Equal(t, "info\n", mustCLI(t, "log", "level", "--data-dir", dir))

	_, stderr, code := runCLIAt(t, time.Now, "", "log", "level", "loud", "--data-dir", dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `log level "loud": want debug, info, warn or error`)

	var reasons []string
	for _, e := range servertest.ReadAuditLog(t, dir) {
		if e.Event == "log_level_changed" {
			reasons = append(reasons, e.Reason)
		}
	}
	assert.Equal(t, []string{"log level warn to debug by admin-socket (admin API)", "log level debug to info by admin-token (admin API)"}, reasons)
}
