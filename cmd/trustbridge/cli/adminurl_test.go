package cli

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
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
	got, err := c.LocalSocket()
	require.NoError(t, err)
	assert.Empty(t, got, "no socket")

	path := filepath.Join(dir, server.AdminSocketName)
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	got, err = c.LocalSocket()
	require.NoError(t, err)
	assert.Empty(t, got, "a regular file")
	require.NoError(t, os.Remove(path))

	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	got, err = c.LocalSocket()
	require.NoError(t, err)
	assert.Equal(t, "unix://"+path, got, "a server answers")

	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	require.FileExists(t, path)
	got, err = c.LocalSocket()
	require.NoError(t, err)
	assert.Empty(t, got, "a stale socket")

	// The default data directory is ./data, as the server's.
	t.Chdir(dir)
	require.NoError(t, os.Mkdir("data", 0o700))
	ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join("data", server.AdminSocketName), Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	got, err = (&AdminClient{}).LocalSocket()
	require.NoError(t, err)
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
	got, err := (&AdminClient{}).LocalSocket()
	require.NoError(t, err)
	assert.Equal(t, "unix://"+filepath.Join("data", server.AdminSocketName), got)
}

// A socket another local user could have put in --data-dir (./data in the
// working directory by default) is not taken for the server's: the CLI
// would trust its answers. A group- or world-writable directory is refused
// on the real file system, and the fallback said on stderr.
func TestLocalSocketWritableDirectory(t *testing.T) {
	dir, err := os.MkdirTemp("", "ls")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	dir, err = filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o700))
	path := filepath.Join(data, server.AdminSocketName)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	c := &AdminClient{DataDir: data}
	got, err := c.LocalSocket()
	require.NoError(t, err)
	require.Equal(t, "unix://"+path, got, "a server answers in a private directory")

	require.NoError(t, os.Chmod(data, 0o777))
	got, err = c.LocalSocket()
	assert.Empty(t, got)
	assert.EqualError(t, err, "its directory "+data+" is writable by group or others (mode 0777), who could put their own socket there; chmod go-w it, or give --admin unix://"+path+" if you trust it")

	cmd := &cobra.Command{Use: "x", Run: func(*cobra.Command, []string) {}}
	cmd.Flags().String("admin", "http://127.0.0.1:15014", "")
	var stderr strings.Builder
	cmd.SetErr(&stderr)
	assert.Equal(t, "http://127.0.0.1:15014", AdminFrom(cmd, c).Addr, "falls back to TCP")
	assert.Equal(t, "warning: not using the admin socket: "+err.Error()+"; using http://127.0.0.1:15014 with the admin token\n", stderr.String())

	require.NoError(t, os.Chmod(data, 0o750))
	got, err = c.LocalSocket()
	require.NoError(t, err)
	assert.Equal(t, "unix://"+path, got, "group-readable is fine")
}

// Who may own the socket and its directory, by uid: this user, root, or
// anyone when the CLI runs as root; and the directory's mode.
func TestSocketTrusted(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	sock := filepath.Join(dir, server.AdminSocketName)
	type owner struct {
		uid  int
		mode fs.FileMode
	}
	for _, tc := range []struct {
		name                string
		euid                int
		sockOwner, dirOwner owner
		want                string
	}{
		{"mine", 1000, owner{1000, fs.ModeSocket | 0o600}, owner{1000, fs.ModeDir | 0o700}, ""},
		{"root's, as a user", 1000, owner{0, fs.ModeSocket | 0o660}, owner{0, fs.ModeDir | 0o755}, ""},
		{"a user's, as root", 0, owner{1000, fs.ModeSocket | 0o600}, owner{1001, fs.ModeDir | 0o700}, ""},
		{"another user's socket", 1000, owner{1001, fs.ModeSocket | 0o600}, owner{1000, fs.ModeDir | 0o700}, sock + " is owned by uid 1001, neither you (uid 1000) nor root"},
		{"another user's directory", 1000, owner{1000, fs.ModeSocket | 0o600}, owner{1001, fs.ModeDir | 0o700}, dir + " is owned by uid 1001, neither you (uid 1000) nor root"},
		{"a group-writable directory", 1000, owner{1000, fs.ModeSocket | 0o600}, owner{1000, fs.ModeDir | 0o770}, "writable by group or others (mode 0770)"},
		{"a world-writable directory, as root", 0, owner{0, fs.ModeSocket | 0o600}, owner{0, fs.ModeDir | 0o1777}, "writable by group or others (mode 0777)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stat := func(p string) (int, fs.FileMode, error) {
				switch p {
				case sock:
					return tc.sockOwner.uid, tc.sockOwner.mode, nil
				case dir:
					return tc.dirOwner.uid, tc.dirOwner.mode, nil
				}
				return 0, 0, fmt.Errorf("unexpected stat of %s", p)
			}
			err := socketTrusted(sock, tc.euid, stat)
			if tc.want == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.want)
			}
		})
	}
	_, err = os.Stat(sock)
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, socketTrusted(sock, 1000, statOwner), sock+": lstat "+sock)
}
