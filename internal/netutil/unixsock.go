package netutil

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
)

// Listener is a unix listener that removes its socket on Close, if the
// path still names the socket it created.
type UnixListener struct {
	*net.UnixListener
	path string
	fi   fs.FileInfo
}

// Close stops listening and removes the socket.
func (l *UnixListener) Close() error {
	err := l.UnixListener.Close()
	if cur, lerr := os.Lstat(l.path); lerr == nil && os.SameFile(cur, l.fi) {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
			err = rerr
		}
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// AnyUser, as ListenUnix's gid, lets every local user connect: the socket
// is 0666 and its directory, when ListenUnix creates it, 0755. Only for a
// server that attests each caller itself (the node agent, which tells
// workloads apart by their processes, as SPIRE's agent does): for any
// other, the socket's mode is its access control.
const AnyUser = -2

// ErrPathTooLong is wrapped by ListenUnix's refusal of a path over the
// length limit of unix socket paths, for a caller that picked the path
// itself and can go without the socket.
var ErrPathTooLong = errors.New("too long")

// maxPath is the size of sun_path on Linux, including the NUL.
const maxPath = 108

// Listen creates the socket at path.
//
// Parent directories are created 0750. Something already at path is
// removed only when it is a socket (Lstat: never a regular file, directory
// or symlink) and inUse, asked about it, returns nil: inUse dials it and
// says why not to replace it when something answers.
//
// The socket is never reachable with a wider mode than intended: it is
// bound inside a fresh 0700 directory next to path, chmod'ed (0600, or
// 0660 and chown'ed to gid when gid >= 0, 0666 for AnyUser), and only then hard-linked to
// path, which also fails rather than replace anything that appeared at
// path meanwhile. The temporary directory (and its link) is removed
// before Listen returns, so the bound socket's name is path from then on.
func ListenUnix(path string, gid int, inUse func(path string) error) (*UnixListener, error) {
	dir := filepath.Dir(path)
	dirMode := os.FileMode(0o750)
	if gid == AnyUser {
		dirMode = 0o755
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil:
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket (%s); refusing to replace it", path, fi.Mode().Type())
		}
		if err := inUse(path); err != nil {
			return nil, err
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("socket path: %w", err)
	}
	return bind(path, gid)
}

// bind binds the socket in a private directory and links it to path.
func bind(path string, gid int) (*UnixListener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".sock")
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	defer os.RemoveAll(tmp)
	tmpPath := filepath.Join(tmp, "s")
	if len(tmpPath) >= maxPath {
		return nil, fmt.Errorf("socket path %s is %w: the socket is first bound at %s, over the %d-byte limit of unix socket paths", path, ErrPathTooLong, tmpPath, maxPath-1)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmpPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	// The name bound is the temporary one; Close removes path itself.
	ln.SetUnlinkOnClose(false)
	mode := os.FileMode(0o600)
	switch {
	case gid == AnyUser:
		mode = 0o666
	case gid >= 0:
		mode = 0o660
		if err := os.Lchown(tmpPath, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket group: %w", err)
		}
	}
	if err := os.Chmod(tmpPath, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	if err := os.Link(tmpPath, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	return &UnixListener{UnixListener: ln, path: path, fi: fi}, nil
}
