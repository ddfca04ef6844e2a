//go:build linux

package attest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A binary attested again unchanged costs an fstat, not a read; one
// changed in place (same size, new times) is read again; one over the
// bound is refused unread.
func TestBinaryDigestCache(t *testing.T) {
	proc := t.TempDir()
	bin := filepath.Join(t.TempDir(), "app")
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "42"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(proc, "42", "exe")))
	write := func(content string) string {
		require.NoError(t, os.WriteFile(bin, []byte(content), 0o755))
		sum := sha256.Sum256([]byte(content))
		return hex.EncodeToString(sum[:])
	}
	a := newAttestor(t, Config{Binary: true, ProcRoot: proc, MaxBinarySize: 16})

	want := write("version-1")
	c := pinnedCaller(t, proc, 42) // connected once the binary exists
	for range 2 {
		_, sum, err := a.binary(c)
		require.NoError(t, err)
		assert.Equal(t, want, sum)
	}
	assert.Equal(t, int64(2), a.digests.hashed.Load(), "a file changed this instant is never cached")
	a.digests.now = func() time.Time { return time.Now().Add(racyWindow) }
	for range 3 {
		path, sum, err := a.binary(c)
		require.NoError(t, err)
		assert.Equal(t, bin, path)
		assert.Equal(t, want, sum)
	}
	assert.Equal(t, int64(3), a.digests.hashed.Load(), "then read once")

	want = write("version-2")
	// The same size; a distinct mtime, as a rewrite a jiffy later has.
	later := time.Now().Add(time.Second)
	require.NoError(t, os.Chtimes(bin, later, later))
	_, sum, err := a.binary(c)
	require.NoError(t, err)
	assert.Equal(t, want, sum, "the new content, not the cached digest")
	assert.Equal(t, int64(4), a.digests.hashed.Load())

	write("a binary over the bound")
	_, _, err = a.binary(c)
	require.ErrorIs(t, err, ErrBinary)
	assert.Equal(t, int64(4), a.digests.hashed.Load(), "refused before any read")
}

// pinnedCaller is pid as the handshake pins it, its executable included.
func pinnedCaller(t *testing.T, proc string, pid int32) *Caller {
	t.Helper()
	c := &Caller{PID: pid, procRoot: proc}
	if fi, err := os.Stat(filepath.Join(proc, strconv.Itoa(int(pid)), "exe")); err == nil {
		c.exe, _ = idOf(fi)
	}
	return c
}

// A process that connected, then exec'ed another binary, is refused: the
// binary a rule would select is not the one that made the connection.
func TestBinaryExecAfterConnect(t *testing.T) {
	proc, dir := t.TempDir(), t.TempDir()
	first, second := filepath.Join(dir, "shell"), filepath.Join(dir, "node_exporter")
	require.NoError(t, os.WriteFile(first, []byte("shell"), 0o755))
	require.NoError(t, os.WriteFile(second, []byte("exporter"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "42"), 0o755))
	exe := filepath.Join(proc, "42", "exe")
	require.NoError(t, os.Symlink(first, exe))
	a := newAttestor(t, Config{Binary: true, ProcRoot: proc})
	c := pinnedCaller(t, proc, 42)

	require.NoError(t, os.Remove(exe))
	require.NoError(t, os.Symlink(second, exe)) // execve
	_, _, err := a.binary(c)
	require.ErrorIs(t, err, ErrBinary)
	assert.ErrorContains(t, err, "exec'ed since")

	_, _, err = a.binary(pinnedCaller(t, proc, 42))
	require.NoError(t, err, "a caller that connected running it is attested")
}
