package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/internal/admin"
)

// adminSocket is --admin-socket: the admin API on a unix socket, mode
// 0600, where the file mode authenticates: whoever can connect is the
// server's user (or root), so changes need no token there. No browser
// reaches a unix socket, so neither the Host check nor a token guards it.
type adminSocket struct {
	path string
	ln   net.Listener
	srv  *http.Server
}

func addAdminSocketFlag(f *pflag.FlagSet, path *string) {
	f.StringVar(path, "admin-socket", "", "also serve the admin API on this unix socket, mode 0600 (e.g. <data-dir>/admin.sock): changes made through it (trustbridge federation add --admin unix://PATH) need no admin token, the socket's owner being the server's user")
}

// listenAdminSocket opens path (nil, nil when it is ""), replacing a
// socket a crashed server left there, never another kind of file.
func listenAdminSocket(path string, h http.Handler, logger *slog.Logger) (*adminSocket, error) {
	if path == "" {
		return nil, nil
	}
	if info, err := os.Lstat(path); err == nil {
		if info.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("--admin-socket %s: exists and is not a socket; remove it or pick another path", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--admin-socket: %w", err)
		}
	}
	// Bound in a private umask so that no other user can connect in the
	// moment before the chmod.
	ln, err := listenUnixPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("--admin-socket: %w", err)
	}
	srv := newAdminServer(h, logger)
	srv.ConnContext = func(ctx context.Context, _ net.Conn) context.Context { return admin.OverSocket(ctx) }
	return &adminSocket{path: path, ln: ln, srv: srv}, nil
}

// close releases the listener before the runners own it (nil-safe).
func (s *adminSocket) close() {
	if s != nil {
		_ = s.ln.Close()
	}
}

// runners serves the socket until the server stops (nil-safe).
func (s *adminSocket) runners() []func(context.Context) error {
	if s == nil {
		return nil
	}
	return []func(context.Context) error{func(ctx context.Context) error {
		err := serveAdmin(ctx, s.srv, s.ln)
		if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
			err = rerr
		}
		return err
	}}
}
