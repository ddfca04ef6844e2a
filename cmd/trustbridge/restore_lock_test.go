//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// restore --force onto the data directory of a running server (a real
// second process) is refused naming the server, before the archive is
// read, and the directory is untouched: nothing moved aside, nothing
// staged in it.
func TestRestoreForceIsRefusedWhileAServerRuns(t *testing.T) {
	dataDir := t.TempDir()
	server := startServerProcess(t, "--trust-domain", "example.org", "--data-dir", dataDir, "--admin-listen", "127.0.0.1:0", "--grpc-listen", "", "--log-format", "json")
	pid := server.cmd.Process.Pid
	archive := filepath.Join(t.TempDir(), "b.tar.gz")
	_, stderr, code := runCLIAt(t, time.Now, "", "backup", "--data-dir", dataDir, "--out", archive)
	require.Equal(t, 0, code, stderr)
	journal := mustReadFile(t, filepath.Join(dataDir, "ca", "state.json"))
	before := names(t, dataDir)

	_, stderr, code = runCLIAt(t, time.Now, "", "restore", "--data-dir", dataDir, "--from", archive, "--force")
	assert.Equal(t, 1, code)
	host, _ := os.Hostname()
	assert.Contains(t, stderr, "restore: data directory in use: "+dataDir+" is in use by another trustbridge: pid "+strconv.Itoa(pid)+" on host "+host+" (trustbridge server)")
	assert.Equal(t, journal, mustReadFile(t, filepath.Join(dataDir, "ca", "state.json")), "the CA state is untouched")
	assert.Equal(t, before, names(t, dataDir), "nothing staged or moved in the data directory")
	left, err := filepath.Glob(dataDir + ".replaced-*")
	require.NoError(t, err)
	assert.Empty(t, left, "nothing moved aside")
	code, _ = servertest.Get(t, "http://"+server.admin+"/healthz")
	assert.Equal(t, 200, code, "the server serves on")
}

// A data directory at the root of a volume holds lost+found and cannot be
// renamed: restore fills it when it holds nothing else, without --force,
// and with --force moves the old entries into DIR/replaced-<time> while
// the directory and lost+found stay in place. The server starts on the
// result.
func TestRestoreOntoAVolumeRoot(t *testing.T) {
	_, archive := backedUpDataDir(t)
	volume := filepath.Join(t.TempDir(), "volume")
	require.NoError(t, os.MkdirAll(filepath.Join(volume, "lost+found"), 0o700))
	stdout, stderr, code := runCLIAt(t, time.Now, "", "restore", "--data-dir", volume, "--from", archive)
	require.Equal(t, 0, code, "lost+found is not an entry: %s", stderr)
	assert.NotContains(t, stdout, "previous contents")

	require.NoError(t, os.WriteFile(filepath.Join(volume, "newer.txt"), []byte("written after the restore"), 0o600))
	info, err := os.Stat(volume)
	require.NoError(t, err)
	stdout, stderr, code = runCLIAt(t, time.Now, "", "restore", "--data-dir", volume, "--from", archive, "--force")
	require.Equal(t, 0, code, stderr)
	moved, err := filepath.Glob(filepath.Join(volume, "replaced-*"))
	require.NoError(t, err)
	require.Len(t, moved, 1)
	assert.Contains(t, stdout, "the previous contents of "+volume+" are in "+moved[0])
	assert.Equal(t, "written after the restore", string(mustReadFile(t, filepath.Join(moved[0], "newer.txt"))), "nothing deleted")
	assert.FileExists(t, filepath.Join(moved[0], "ca", "state.json"))
	assert.NoFileExists(t, filepath.Join(volume, "newer.txt"))
	assert.DirExists(t, filepath.Join(volume, "lost+found"), "lost+found stays")
	after, err := os.Stat(volume)
	require.NoError(t, err)
	assert.True(t, os.SameFile(info, after), "the directory itself stayed in place")
	left, err := filepath.Glob(filepath.Join(volume, ".restore-*"))
	require.NoError(t, err)
	assert.Empty(t, left, "no staging directory left")

	s := startE2EServer(t, "east.example", volume, nil)
	assert.NotZero(t, servedSequence(t, s))
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}
