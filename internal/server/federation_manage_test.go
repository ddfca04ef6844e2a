package server

import (
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	first, err := listenAdminSocket(sock, http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = listenAdminSocket(sock, http.NotFoundHandler(), slog.New(slog.DiscardHandler))
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
	again, err := listenAdminSocket(sock, http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	require.NoError(t, err, "a stale socket is replaced")
	again.close()
}
