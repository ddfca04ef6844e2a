package netutil

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "us")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func stale(string) error { return nil }

// The socket is 0600 from the start and gone after Close.
func TestListenMode(t *testing.T) {
	path := filepath.Join(shortDir(t), "s")
	ln, err := ListenUnix(path, -1, stale)
	require.NoError(t, err)
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.NoError(t, ln.Close())
	assert.NoFileExists(t, path)
}

// AnyUser: every local user may connect, through a directory Listen
// creates 0755; the socket is never wider before it has its name.
func TestListenAnyUser(t *testing.T) {
	dir := filepath.Join(shortDir(t), "d")
	path := filepath.Join(dir, "s")
	ln, err := ListenUnix(path, AnyUser, stale)
	require.NoError(t, err)
	defer ln.Close()
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o666), fi.Mode().Perm())
	di, err := os.Stat(dir)
	require.NoError(t, err)
	assert.NotZero(t, di.Mode().Perm()&0o001, "others may traverse the directory")
}

// Close leaves alone a newer socket at the same path: a server that
// replaced ours keeps its socket when we stop.
func TestCloseKeepsANewerSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "s")
	old, err := ListenUnix(path, -1, stale)
	require.NoError(t, err)
	newer, err := ListenUnix(path, -1, stale) // inUse says stale: replaced
	require.NoError(t, err)
	t.Cleanup(func() { newer.Close() })
	require.NoError(t, old.Close())
	conn, err := net.Dial("unix", path)
	require.NoError(t, err, "the newer server's socket is still there")
	conn.Close()
}

// A socket in use is not replaced: inUse's error is returned and the
// socket stays; a file that is not a socket is never replaced.
func TestListenRefuses(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "s")
	first, err := ListenUnix(path, -1, stale)
	require.NoError(t, err)
	t.Cleanup(func() { first.Close() })
	inUse := errors.New("in use")
	_, err = ListenUnix(path, -1, func(p string) error {
		assert.Equal(t, path, p)
		return inUse
	})
	require.ErrorIs(t, err, inUse)
	conn, err := net.Dial("unix", path)
	require.NoError(t, err, "the first socket is kept")
	conn.Close()

	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	_, err = ListenUnix(file, -1, stale)
	require.ErrorContains(t, err, "is not a socket")
	assert.FileExists(t, file)
}
