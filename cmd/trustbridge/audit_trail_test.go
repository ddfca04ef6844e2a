package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

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
	_, metrics := servertest.Get(t, "http://"+admin+"/metrics")
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
