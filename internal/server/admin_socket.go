package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/netutil"
	"github.com/trustbridge/trustbridge/internal/server/admin"
)

// adminSocket is --admin-socket: the admin API on a unix socket, mode
// 0600, where the file mode authenticates: whoever can connect is the
// server's user (or root), so changes need no token there. No browser
// reaches a unix socket, so neither the Host check nor a token guards it.
type adminSocket struct {
	ln   net.Listener
	srv  *http.Server
	path string
	auto bool // at <data-dir>/admin.sock, where the CLI looks
}

// AdminSocketName is the admin socket's name in the data directory, where
// --admin-socket auto puts it and the CLI looks for it.
const AdminSocketName = "admin.sock"

// AdminSocketAuto is --admin-socket's default: <data-dir>/admin.sock.
const AdminSocketAuto = "auto"

func addAdminSocketFlag(f *pflag.FlagSet, path *string) {
	f.StringVar(path, "admin-socket", AdminSocketAuto, "also serve the admin API on this unix socket, mode 0600: changes made through it need no admin token, the socket's owner being the server's user. "+
		"auto: <data-dir>/"+AdminSocketName+", where trustbridge finds it with --data-dir (default ./data) and no --admin (left out, with a warning, when that path is too long for a unix socket); "+
		`"" for none`)
}

// adminSocketPath is the socket --admin-socket names, and whether it is
// the default one of auto; "" for none.
func adminSocketPath(o Config) (path string, auto bool) {
	if o.AdminSocket == AdminSocketAuto {
		return filepath.Join(o.DataDir, AdminSocketName), true
	}
	return o.AdminSocket, false
}

// listenAdminSocket opens the socket of --admin-socket (nil, nil for
// none), replacing a socket a crashed server left there, never another
// kind of file, nor a socket another server still answers on. The socket
// is bound as the agent's SDS socket is (internal/netutil): mode 0600
// before it gets its name, and removed at close only while the path still
// names it. The default path, too long for a socket in a deep data
// directory, is left out with a warning rather than refuse to start.
func listenAdminSocket(o Config, h http.Handler, logger *slog.Logger) (*adminSocket, error) {
	path, auto := adminSocketPath(o)
	if path == "" {
		return nil, nil
	}
	ln, err := netutil.ListenUnix(path, -1, adminSocketInUse)
	if auto && errors.Is(err, netutil.ErrPathTooLong) {
		logger.Warn("no admin socket: the data directory's path is too long for a unix socket; give --admin-socket a shorter path (e.g. /run/trustbridge/admin.sock), or --admin-socket \"\" to silence this",
			logattr.Error, err)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--admin-socket %s: %w", path, err)
	}
	srv := NewAdminServer(h, logger)
	srv.ConnContext = func(ctx context.Context, _ net.Conn) context.Context { return admin.OverSocket(ctx) }
	return &adminSocket{ln: ln, srv: srv, path: path, auto: auto}, nil
}

// where is the socket's path for the start-up record; "" without one.
func (s *adminSocket) where() string {
	if s == nil {
		return ""
	}
	if abs, err := filepath.Abs(s.path); err == nil {
		return abs
	}
	return s.path
}

// howToReach tells an operator how the CLI reaches the socket, for the
// banner.
func (s *adminSocket) howToReach(dataDir string) string {
	if s.auto {
		return "trustbridge finds it with --data-dir " + dataDir
	}
	return "trustbridge ... --admin unix://" + s.where()
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
