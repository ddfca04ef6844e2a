package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/internal/netutil"
	"github.com/trustbridge/trustbridge/internal/server/admin"
)

// adminSocket is --admin-socket: the admin API on a unix socket, mode
// 0600, where the file mode authenticates: whoever can connect is the
// server's user (or root), so changes need no token there. No browser
// reaches a unix socket, so neither the Host check nor a token guards it.
type adminSocket struct {
	ln  net.Listener
	srv *http.Server
}

func addAdminSocketFlag(f *pflag.FlagSet, path *string) {
	f.StringVar(path, "admin-socket", "", "also serve the admin API on this unix socket, mode 0600 (e.g. <data-dir>/admin.sock): changes made through it (trustbridge federation add --admin unix://PATH) need no admin token, the socket's owner being the server's user")
}

// listenAdminSocket opens path (nil, nil when it is ""), replacing a
// socket a crashed server left there, never another kind of file, nor a
// socket another server still answers on. The socket is bound as the
// agent's SDS socket is (internal/netutil): mode 0600 before it gets its
// name, and removed at close only while the path still names it.
func listenAdminSocket(path string, h http.Handler, logger *slog.Logger) (*adminSocket, error) {
	if path == "" {
		return nil, nil
	}
	ln, err := netutil.ListenUnix(path, -1, adminSocketInUse)
	if err != nil {
		return nil, fmt.Errorf("--admin-socket: %w", err)
	}
	srv := NewAdminServer(h, logger)
	srv.ConnContext = func(ctx context.Context, _ net.Conn) context.Context { return admin.OverSocket(ctx) }
	return &adminSocket{ln: ln, srv: srv}, nil
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
		// The listener's Close removes the socket, if it is still ours.
		return ServeAdmin(ctx, s.srv, s.ln)
	}}
}

// adminSocketInUse dials a socket found at path: one that answers belongs
// to a running server (another one, on the same data directory perhaps),
// and is not ours to replace.
func adminSocketInUse(path string) error {
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil // stale: nothing listens
	}
	_ = conn.Close()
	return fmt.Errorf("%s: another server answers on this socket; stop it, or give this one another --admin-socket", path)
}
