package main

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

func auditEvents(entries []audit.Entry, td string) []string {
	var out []string
	for _, e := range entries {
		if e.TrustDomain == td {
			out = append(out, e.Event)
		}
	}
	return out
}

// A federated pair writes what it trusts at start and every bundle it
// accepts; the log verifies, and stops verifying once edited.
func TestAuditLogE2E(t *testing.T) {
	east, west := startSPIFFEPair(t, nil, nil)
	waitFederated(t, west, "east.example", 1, 30*time.Second)

	path := filepath.Join(west.dataDir, "audit.jsonl")
	var entries []audit.Entry
	require.Eventually(t, func() bool {
		entries = servertest.ReadAuditLog(t, west.dataDir)
		return len(auditEvents(entries, "east.example")) >= 2
	}, 10*time.Second, 20*time.Millisecond)
	host, _ := os.Hostname()
	assert.Equal(t, "baseline", entries[0].Event)
	assert.Equal(t, "west.example", entries[0].TrustDomain)
	assert.Equal(t, host, entries[0].Actor)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	var baseline, accepted *audit.Entry
	for i, e := range entries {
		switch {
		case e.TrustDomain != "east.example":
		case e.Event == "baseline":
			baseline = &entries[i]
		case e.Event == "bundle_accepted":
			accepted = &entries[i]
		}
	}
	// West starts from the bootstrap bundle its operator gave it; the
	// first fetch confirms the same root under east's sequence.
	require.NotNil(t, baseline, "events: %v", auditEvents(entries, "east.example"))
	assert.Equal(t, east.bundleURL, baseline.SourceURL)
	assert.Equal(t, []string{"x509:" + servertest.SHA256Hex(caRootsOf(t, east)[0].Raw)}, baseline.Added)
	require.NotNil(t, accepted, "events: %v", auditEvents(entries, "east.example"))
	assert.Equal(t, east.bundleURL, accepted.SourceURL)
	assert.NotNil(t, accepted.NewSequence)
	assert.NotEmpty(t, accepted.Prev)

	out, stderr, code := runCLI(t, "", "audit", "log", "verify", path)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "ok, ")
	head := strings.TrimSpace(out[strings.Index(out, "head ")+5:])
	_, _, code = runCLI(t, "", "audit", "log", "verify", path, "--expect-head", head)
	assert.Equal(t, 0, code)
	_, stderr, code = runCLI(t, "", "audit", "log", "verify", path, "--expect-head", strings.Repeat("0", 64))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "cut off")

	// Edit a copy: the chain no longer verifies.
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	edited := filepath.Join(t.TempDir(), "edited.jsonl")
	require.NoError(t, os.WriteFile(edited, []byte(strings.Replace(string(data), `"event":"bundle_accepted"`, `"event":"bundle_rejected"`, 1)), 0o600))
	_, stderr, code = runCLI(t, "", "audit", "log", "verify", edited)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "was edited")

	// A server whose audit log does not verify refuses to start rather
	// than vouch for it.
	west.stop()
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(data), `"event":"bundle_accepted"`, `"event":"bundle_rejected"`, 1)), 0o600))
	_, stderr, code = runCLI(t, "", "server", "--trust-domain", "west.example", "--data-dir", west.dataDir, "--admin-listen", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "move it aside")
}

func serveFakeSnapshot(t *testing.T, snap api.Snapshot) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/snapshot" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(snap)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestAuditCommand(t *testing.T) {
	exp := time.Now().Add(20 * 24 * time.Hour)
	warnOnly := api.Snapshot{Time: time.Now(), TrustDomain: "east.example", Actor: "r1", TrustDomains: []api.TrustDomain{{
		Name: "east.example", Local: true, Authorities: []api.Authority{{Kind: "x509", SHA256: "aa", Subject: "CN=east root", NotAfter: &exp, IsCA: true}},
	}}}
	critical := warnOnly
	critical.TrustDomains = append(critical.TrustDomains, api.TrustDomain{Name: "west.example",
		Federation: &api.Federation{EndpointURL: "https://west.example/", State: "failing", Refusals: map[string]uint64{"sequence_regression": 1}}})
	warnURL, critURL := serveFakeSnapshot(t, warnOnly), serveFakeSnapshot(t, critical)

	out, stderr, code := runCLI(t, "", "audit", "--admin", warnURL)
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "0 critical, 1 warning")
	assert.Contains(t, out, "WARNING")
	assert.Contains(t, out, "fix: ")

	_, stderr, code = runCLI(t, "", "audit", "--admin", warnURL, "--fail-on", "warning")
	assert.Equal(t, cli.ExitFindings, code)
	assert.Contains(t, stderr, "findings at or above warning")

	out, _, code = runCLI(t, "", "audit", "--admin", critURL, "-o", "json")
	assert.Equal(t, cli.ExitFindings, code)
	var fs []api.Finding
	require.NoError(t, json.Unmarshal([]byte(out), &fs))
	require.Len(t, fs, 2)
	// --json, the flag -o replaced, prints the same and warns on stderr.
	old, stderr, code := runCLI(t, "", "audit", "--admin", critURL, "--json")
	assert.Equal(t, cli.ExitFindings, code)
	assert.Equal(t, out, old)
	assert.Contains(t, stderr, "use -o json")
	yml, _, code := runCLI(t, "", "audit", "--admin", critURL, "-o", "yaml")
	assert.Equal(t, cli.ExitFindings, code)
	var fromYAML []api.Finding
	require.NoError(t, yaml.Unmarshal([]byte(yml), &fromYAML))
	assert.Equal(t, fs, fromYAML, "yaml carries the json keys")
	assert.Equal(t, audit.CodeSequenceRegress, fs[0].Code)

	_, _, code = runCLI(t, "", "audit", "--admin", critURL, "--fail-on", "none")
	assert.Equal(t, 0, code)
	_, stderr, code = runCLI(t, "", "audit", "--admin", critURL, "--fail-on", "sometimes")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--fail-on")

	// An admin that cannot be reached is an error, not a clean audit.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, stderr, code = runCLI(t, "", "audit", "--admin", dead.URL)
	assert.Equal(t, 1, code)
	assert.NotEmpty(t, stderr)
}

// The real server's own snapshot of a fresh trust domain has no findings.
func TestAuditCommandOnRealServer(t *testing.T) {
	addr, _ := startServer(t, t.TempDir())
	out, stderr, code := runCLIAt(t, time.Now, "", "audit", "--admin", "http://"+addr, "--fail-on", "warning")
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "no findings")
}

// A log that ends in a torn write (a crash mid-append) is told apart from
// tampering: verify says so with its own exit status and reports the
// entries before it; the server moves the torn bytes into a file of their
// own at start, warns and records a log_recovered entry, so it starts
// instead of refusing.
func TestAuditLogTornTail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := audit.Open(path)
	require.NoError(t, err)
	require.NoError(t, l.Append(audit.Entry{Event: "baseline", TrustDomain: "west.example"}))
	require.NoError(t, l.Append(audit.Entry{Event: "bundle_accepted", TrustDomain: "east.example"}))
	head, _ := l.Head()
	require.NoError(t, l.Close())
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(good, `{"seq":3,"time":"2026-`...), 0o600))

	out, stderr, code := runCLI(t, "", "audit", "log", "verify", path)
	assert.Equal(t, cli.ExitTornTail, code)
	assert.Contains(t, out, "ok, 2 entries")
	assert.Contains(t, out, "head "+head)
	assert.Contains(t, stderr, "torn tail: 22 bytes")
	assert.Contains(t, stderr, "not an edit")
	assert.NotContains(t, stderr, "does not verify")

	out, _, code = runCLI(t, "", "audit", "log", "verify", "-o", "json", "--expect-head", head, path)
	assert.Equal(t, cli.ExitTornTail, code)
	var res audit.VerifyResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	assert.Equal(t, int64(22), res.TornBytes)
	assert.Equal(t, uint64(2), res.Entries)

	var logs testlog.Buffer
	trail, closeLog, err := server.OpenAuditTrail(server.Config{DataDir: dir}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	require.NotNil(t, trail)
	closeLog()
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "torn_bytes=22")
	assert.Contains(t, logs.String(), "torn_file="+path+audit.TornTailSuffix+"2-")
	entries := servertest.ReadAuditLog(t, dir)
	require.Len(t, entries, 3)
	host, _ := os.Hostname()
	assert.Equal(t, "log_recovered", entries[2].Event)
	assert.Equal(t, host, entries[2].Actor)
	assert.Equal(t, head, entries[2].Prev)
	_, _, code = runCLI(t, "", "audit", "log", "verify", path)
	assert.Equal(t, 0, code)
}
