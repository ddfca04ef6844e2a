package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// testEnv is the env a test runs a server or an agent in, logging in
// format: with "json", standard output and the log are checked line by
// line (testlog.JSONLines), so every record the e2e tests make is JSON
// with unique keys, and nothing else reaches a log pipeline.
func testEnv(tb testing.TB, format string) (e env, out, logs *testlog.Buffer) {
	out, logs = &testlog.Buffer{}, &testlog.Buffer{}
	if format == "json" {
		out, logs = testlog.JSONLines(tb), testlog.JSONLines(tb)
	}
	return env{in: strings.NewReader(""), out: out, err: logs, now: time.Now}, out, logs
}

// With JSON logs the server writes nothing but JSON lines (testEnv checks
// them) and lists at start its version, listeners and every configured
// peer; with text logs a person gets the banner on standard output too.
func TestServerStartRecords(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			o := baseServerOptions("example.org", t.TempDir())
			o.LogFormat = format
			o.Federation.Federate = "web.example|https://web.example/bundle||other.example|https://other.example:8443/b"
			admin, started, _ := launchServer(t, o)
			if format == "text" {
				assert.Contains(t, started, "trustbridge is serving trust domain example.org\n  version:    "+buildVersion())
				assert.Contains(t, started, "  federates:  other.example https://other.example:8443/b (https_web, from flag)\n              web.example https://web.example/bundle (https_web, from flag)\n")
				return
			}
			rec := servertest.LogRecord(started, "trustbridge server started")
			require.NotNil(t, rec, started)
			assert.Equal(t, buildVersion(), rec["version"])
			assert.Equal(t, "example.org", rec["trust_domain"])
			assert.Equal(t, map[string]any{"admin": admin}, rec["listeners"])
			var peers []map[string]any
			for _, line := range strings.Split(started, "\n") {
				var r map[string]any
				if json.Unmarshal([]byte(line), &r) == nil && r["msg"] == "federated trust domain configured" {
					delete(r, "time")
					peers = append(peers, r)
				}
			}
			assert.Equal(t, []map[string]any{
				{"level": "INFO", "msg": "federated trust domain configured", "trust_domain": "other.example", "endpoint_url": "https://other.example:8443/b", "profile": "https_web", "origin": "flag"},
				{"level": "INFO", "msg": "federated trust domain configured", "trust_domain": "web.example", "endpoint_url": "https://web.example/bundle", "profile": "https_web", "origin": "flag"},
			}, peers)
		})
	}
}

// The server's logger filters by a level the admin API changes at run
// time: what was below it is written once it is lowered.
func TestLevelLoggerChangesAtRunTime(t *testing.T) {
	var buf bytes.Buffer
	logger, level, err := newLevelLogger(&buf, "json", "info")
	require.NoError(t, err)
	logger.Debug("hidden")
	level.Set(slog.LevelDebug)
	logger.Debug("shown")
	assert.NotContains(t, buf.String(), "hidden")
	assert.Contains(t, buf.String(), `"msg":"shown"`)
	_, _, err = newLevelLogger(&buf, "json", "loud")
	assert.ErrorContains(t, err, `--log-level "loud"`)
}

// The banner and the start-up record name the admin socket and how the
// CLI reaches it: with --data-dir for the default one, with --admin
// unix://PATH for one elsewhere.
func TestStartRecordsNameTheAdminSocket(t *testing.T) {
	dir := t.TempDir()
	o := baseServerOptions("example.org", dir)
	o.LogFormat, o.AdminSocket = "text", AdminSocketAuto
	_, started, stop := launchServer(t, o)
	sock := filepath.Join(dir, AdminSocketName)
	assert.Contains(t, started, "  socket:     "+sock+" (admin API, no token: trustbridge finds it with --data-dir "+dir+")\n")
	stop()

	other := filepath.Join(t.TempDir(), "a.sock")
	o.LogFormat, o.AdminSocket = "json", other
	_, started, _ = launchServer(t, o)
	assert.Equal(t, other, servertest.LogAttr(t, started, "trustbridge server started", "admin_socket"))
	assert.NoFileExists(t, sock)
}
