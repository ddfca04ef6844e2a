package cli

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
)

// --admin as operators type it: what cannot work says what to write
// instead of Go's URL error (issue 36, item 4).
func TestAdminURL(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:15014", "https://admin.example", "unix:///run/admin.sock", "http://[::1]:15014"} {
		got, err := AdminURL(ok)
		require.NoError(t, err, ok)
		assert.Equal(t, ok, got)
	}
	_, err := AdminURL("127.0.0.1:15014")
	assert.EqualError(t, err, `--admin "127.0.0.1:15014": want http://HOST:PORT (e.g. http://127.0.0.1:15014), https://HOST:PORT or unix://PATH of the server's --admin-socket`)
	for _, bad := range []string{"", "ftp://x:1", "http://", "http://u:p@127.0.0.1:1", "http://127.0.0.1:1?x=1", ":::"} {
		_, err := AdminURL(bad)
		assert.ErrorContains(t, err, "want http://HOST:PORT (e.g. http://", bad)
	}
	assert.ErrorContains(t, TokenTransportOK("127.0.0.1:15014"), "want http://HOST:PORT")
}

// Without --admin the CLI takes the admin socket in --data-dir only when
// a server answers on it: not a missing one, a regular file, nor the
// socket a crashed server left (nothing listens); those fall back to
// --admin's default address with the token.
func TestLocalSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "ls")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &AdminClient{DataDir: dir}
	_, ok := c.LocalSocket()
	assert.False(t, ok, "no socket")

	path := filepath.Join(dir, server.AdminSocketName)
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, ok = c.LocalSocket()
	assert.False(t, ok, "a regular file")
	require.NoError(t, os.Remove(path))

	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	got, ok := c.LocalSocket()
	assert.True(t, ok, "a server answers")
	assert.Equal(t, "unix://"+path, got)

	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	require.FileExists(t, path)
	_, ok = c.LocalSocket()
	assert.False(t, ok, "a stale socket")

	// The default data directory is ./data, as the server's.
	t.Chdir(dir)
	require.NoError(t, os.Mkdir("data", 0o700))
	ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join("data", server.AdminSocketName), Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	got, ok = (&AdminClient{}).LocalSocket()
	assert.True(t, ok)
	assert.Equal(t, "unix://"+filepath.Join(dir, "data", server.AdminSocketName), got)
}

// In a working directory too deep for an absolute socket path, the socket
// of ./data is still found, by the relative path the server bound.
func TestLocalSocketDeepDirectory(t *testing.T) {
	dir, err := os.MkdirTemp("", "ls")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	deep := filepath.Join(dir, strings.Repeat("d", 100))
	require.NoError(t, os.MkdirAll(filepath.Join(deep, "data"), 0o700))
	t.Chdir(deep)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join("data", server.AdminSocketName), Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	got, ok := (&AdminClient{}).LocalSocket()
	assert.True(t, ok)
	assert.Equal(t, "unix://"+filepath.Join("data", server.AdminSocketName), got)
}
