package main

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// fullDisk accepts a number of writes, then fails as a full disk does.
type fullDisk struct{ left int }

func (d *fullDisk) Write(p []byte) (int, error) {
	if d.left == 0 {
		return 0, errors.New("no space left on device")
	}
	d.left--
	return len(p), nil
}

// An audit entry that cannot be written is reported three ways: the
// error log, trustbridge_audit_write_failures_total, and no head advance;
// the next entry that fits continues the chain.
func TestAuditTrailReportsWriteFailures(t *testing.T) {
	disk := &fullDisk{left: 1}
	l := audit.New(disk)
	var logs testlog.Buffer
	trail, err := newAuditTrail(l, "replica-1", nil, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)

	trail.record(audit.Entry{Event: "baseline", TrustDomain: "west.example"})
	head, n := l.Head()
	require.Equal(t, uint64(1), n)

	trail.record(audit.Entry{Event: "bundle_accepted", TrustDomain: "east.example"})
	assert.Equal(t, 1.0, testutil.ToFloat64(trail.failures))
	assert.Contains(t, logs.String(), "level=ERROR")
	assert.Contains(t, logs.String(), "audit entry not written")
	assert.Contains(t, logs.String(), "no space left on device")
	gotHead, gotN := l.Head()
	assert.Equal(t, head, gotHead, "the chain still ends at the last entry written")
	assert.Equal(t, n, gotN)

	disk.left = 1
	trail.record(audit.Entry{Event: "bundle_accepted", TrustDomain: "east.example"})
	_, n = l.Head()
	assert.Equal(t, uint64(2), n)
	assert.Equal(t, 1.0, testutil.ToFloat64(trail.appended.WithLabelValues("bundle_accepted")))
}

// A real server whose audit log was torn by a crash mid-write (issue 14
// item 4) starts again: the torn tail is moved into a file of its own
// (issue 21 item 1: never silently rewritten), recorded in the chain and
// counted, and the chain verifies. An edited entry in the middle still
// stops it.
func TestServerRecoversATornAuditTail(t *testing.T) {
	dataDir := t.TempDir()
	o := baseServerOptions("example.org", dataDir)
	_, _, stop := launchServer(t, o)
	stop()
	path := filepath.Join(dataDir, "audit.jsonl")
	whole, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotEmpty(t, whole)

	// The crash: half an entry, no newline.
	const tail = `{"seq":99,"time":"2026-11-24T00:00:00Z","kind":"bundle_acc`
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(tail)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, stderr, code := runCLI(t, "", "audit", "log", "verify", path)
	assert.Equal(t, 3, code, "a torn tail is told apart from tampering")
	assert.Contains(t, stderr, "torn")
	assert.Contains(t, stderr, "the server moves them into "+path+audit.TornTailSuffix+"<seq>-<hash> at its next start")

	admin, _, stop := launchServer(t, o)
	_, metrics := get(t, "http://"+admin+"/metrics")
	assert.Contains(t, metrics, `trustbridge_audit_entries_total{event="log_recovered"} 1`)
	stop()
	copies, err := filepath.Glob(path + audit.TornTailSuffix + "*")
	require.NoError(t, err)
	require.Len(t, copies, 1)
	kept, err := os.ReadFile(copies[0])
	require.NoError(t, err)
	assert.Equal(t, tail, string(kept), "the torn bytes are kept, byte for byte")
	out, stderr, code := runCLI(t, "", "audit", "log", "verify", path)
	require.Equal(t, 0, code, stderr)
	assert.NotEmpty(t, out)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(data, whole), "every whole entry kept")
	assert.Contains(t, string(data[len(whole):]), `"log_recovered"`)

	// Tampering in the middle is not a torn tail: the server refuses.
	edited := bytes.Replace(data, []byte(`"example.org"`), []byte(`"exampl3.org"`), 1)
	require.NotEqual(t, data, edited)
	require.NoError(t, os.WriteFile(path, edited, 0o600))
	err = serverError(t, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "audit")
}
