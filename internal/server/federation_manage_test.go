package server

import (
	"bytes"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --admin-socket is not taken from a server that still answers on it
// (the error names the path, its socket stays); a stale one is replaced.
func TestAdminSocketInUse(t *testing.T) {
	dir, err := os.MkdirTemp("", "as")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "admin.sock")
	first, err := listenAdminSocket(Config{AdminSocket: sock}, http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = listenAdminSocket(Config{AdminSocket: sock}, http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	require.Error(t, err)
	assert.Contains(t, err.Error(), sock+": another server answers on this socket")
	conn, err := net.Dial("unix", sock)
	require.NoError(t, err, "the first server's socket is kept")
	conn.Close()
	first.close()
	assert.NoFileExists(t, sock)

	// A crashed server's socket: bound, never unlinked, nothing listens.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	require.FileExists(t, sock)
	again, err := listenAdminSocket(Config{AdminSocket: sock}, http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	require.NoError(t, err, "a stale socket is replaced")
	again.close()
}

// --admin-socket auto (the flag's default) is <data-dir>/admin.sock, mode
// 0600; a data directory too deep for a unix socket path leaves it out
// with a warning naming the fix, while an explicit path that long is
// refused; "" is none.
func TestAdminSocketAuto(t *testing.T) {
	dir, err := os.MkdirTemp("", "as")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))

	s, err := listenAdminSocket(Config{AdminSocket: AdminSocketAuto, DataDir: dir}, http.NotFoundHandler(), logger)
	require.NoError(t, err)
	require.NotNil(t, s)
	fi, err := os.Lstat(filepath.Join(dir, AdminSocketName))
	require.NoError(t, err)
	assert.Equal(t, fs.ModeSocket, fi.Mode().Type())
	assert.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())
	assert.Equal(t, filepath.Join(dir, AdminSocketName), s.where())
	s.close()

	deep := filepath.Join(dir, strings.Repeat("d", 100))
	require.NoError(t, os.Mkdir(deep, 0o700))
	s, err = listenAdminSocket(Config{AdminSocket: AdminSocketAuto, DataDir: deep}, http.NotFoundHandler(), logger)
	require.NoError(t, err, "the default socket never stops a start")
	assert.Nil(t, s)
	assert.Contains(t, logs.String(), "no admin socket: the data directory's path is too long for a unix socket; give --admin-socket a shorter path")
	assert.NoFileExists(t, filepath.Join(deep, AdminSocketName))

	_, err = listenAdminSocket(Config{AdminSocket: filepath.Join(deep, "a.sock"), DataDir: dir}, http.NotFoundHandler(), logger)
	require.Error(t, err, "a path the operator named is refused")
	assert.Contains(t, err.Error(), "--admin-socket "+filepath.Join(deep, "a.sock")+": socket path")
	assert.Contains(t, err.Error(), "is too long")

	s, err = listenAdminSocket(Config{AdminSocket: "", DataDir: dir}, http.NotFoundHandler(), logger)
	require.NoError(t, err)
	assert.Nil(t, s)
	assert.NoFileExists(t, filepath.Join(dir, AdminSocketName))
}
