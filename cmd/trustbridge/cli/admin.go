package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
)

// AdminTokenEnv names the admin token file when --admin-token-file is not
// given.
const AdminTokenEnv = "TRUSTBRIDGE_ADMIN_TOKEN_FILE"

// AdminFlagHelp describes --admin wherever a command talks to the admin API.
const AdminFlagHelp = "the server's admin address: http://HOST:PORT, or unix://PATH of its --admin-socket (no token needed there); " +
	"left out: the admin socket in --data-dir (" + server.AdminSocketName + ") when a server answers there, else http://127.0.0.1:15014 with the admin token"

// AdminClient talks to a running server's admin API; mutations bear the
// token the server wrote into its data directory.
type AdminClient struct {
	Addr      string
	DataDir   string
	TokenFile string
}

// AddAuthFlags registers where the admin token is, and the admin socket.
func (c *AdminClient) AddAuthFlags(f *pflag.FlagSet) {
	c.AddDataDirFlag(f)
	f.StringVar(&c.TokenFile, "admin-token-file", "", "file holding the admin token (default <data-dir>/"+server.AdminTokenName+"; env "+AdminTokenEnv+")")
}

// AddDataDirFlag registers --data-dir, where the admin socket is, for a
// command that reads without the token.
func (c *AdminClient) AddDataDirFlag(f *pflag.FlagSet) {
	f.StringVar(&c.DataDir, "data-dir", "./data", "the server's --data-dir, where it serves its admin socket ("+server.AdminSocketName+", used when --admin is left out) and writes its admin token ("+server.AdminTokenName+", mode 0600, new at each start)")
}

// Token reads the admin token: --admin-token-file, else the environment,
// else the data directory's.
func (c *AdminClient) Token() (string, error) {
	path := c.TokenFile
	if path == "" {
		path = os.Getenv(AdminTokenEnv)
	}
	if path == "" {
		path = filepath.Join(c.DataDir, server.AdminTokenName)
	}
	data, err := ReadSmallFile(path, 4<<10)
	if err != nil {
		return "", fmt.Errorf("admin token: %w; run this as the server's user on its host with the server's --data-dir (or --admin-token-file): the server writes the token there at each start", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// Do sends one request; auth adds the token. A non-2xx answer is an error
// carrying the server's message.
func (c *AdminClient) Do(ctx context.Context, method, path string, body []byte, auth bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := AdminURL(c.Addr); err != nil {
		return "", err
	}
	client, base := c.Client()
	// The transport is this call's own: leave no idle connection behind
	// to count against the admin listener's per-source limit.
	defer client.CloseIdleConnections()
	u := base + path
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	if auth && !strings.HasPrefix(c.Addr, "unix://") {
		if err := TokenTransportOK(c.Addr); err != nil {
			return "", err
		}
		tok, err := c.Token()
		if err != nil {
			return "", err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w (is the server running? its admin address is --admin)", err)
	}
	defer resp.Body.Close()
	out, err := bundledoc.ReadLimited(resp.Body, 16<<20)
	if err != nil {
		return "", err
	}
	if resp.StatusCode/100 != 2 {
		return "", &AdminError{Method: method, URL: u, Status: resp.Status, Code: resp.StatusCode, Message: strings.TrimSpace(string(out))}
	}
	return string(out), nil
}

// AdminError is an answer of the admin API that is not 2xx, for a caller
// that tells one status from another (errors.As).
type AdminError struct {
	Method, URL, Status string
	Code                int
	// Message is the server's answer, which says what was wrong.
	Message string
}

func (e *AdminError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.URL, e.Status, e.Message)
}

// Relay sends one request, as do, and copies the server's answer to w.
func (c *AdminClient) Relay(ctx context.Context, w io.Writer, method, path string, body []byte, auth bool) error {
	out, err := c.Do(ctx, method, path, body, auth)
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, out)
	return err
}

// Client is the HTTP client and base URL of c.addr: "unix://PATH" is the
// server's --admin-socket, where the socket's mode stands for the token.
// Neither follows a proxy (HTTP_PROXY would see the token) nor a redirect
// (Go keeps the token on a redirect to the same host, even to http).
func (c *AdminClient) Client() (*http.Client, string) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	base := strings.TrimRight(c.Addr, "/")
	if path, ok := strings.CutPrefix(c.Addr, "unix://"); ok {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
		base = "http://localhost"
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}, base
}

// TokenTransportOK refuses to let the admin token leave the host in clear
// text: it goes over https, or plain http to a loopback host only. The
// admin listener may bind 0.0.0.0 (the Helm chart does), which makes an
// http://POD-IP address work, and sends the token over the pod network.
func TokenTransportOK(addr string) error {
	norm, err := AdminURL(addr)
	if err != nil {
		return err
	}
	u, err := url.Parse(norm)
	if err != nil {
		return fmt.Errorf("--admin %q: %w", addr, err)
	}
	switch {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && isLoopbackHost(u.Hostname()):
		return nil
	case u.Scheme != "http":
		return fmt.Errorf("--admin %q: want http://127.0.0.1:PORT, https://HOST:PORT or unix://PATH", addr)
	}
	return fmt.Errorf("--admin %s: refusing to send the admin token in clear text to a host that is not loopback "+
		"(plain http is for 127.0.0.0/8, ::1 or localhost); run this on the server's host, use its --admin-socket "+
		"(--admin unix://PATH), or forward the admin port to loopback (kubectl port-forward POD 15014) and use --admin http://127.0.0.1:15014", addr)
}

// AdminURL checks --admin: unix://PATH, or an http:// or https:// URL of
// a host; anything else (HOST:PORT without a scheme, another scheme, user
// info) is refused saying what to write, not with Go's URL error.
func AdminURL(addr string) (string, error) {
	if strings.HasPrefix(addr, "unix://") {
		return addr, nil
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		example := "http://127.0.0.1:15014"
		if !strings.Contains(addr, "://") && addr != "" {
			example = "http://" + addr
		}
		return "", fmt.Errorf("--admin %q: want http://HOST:PORT (e.g. %s), https://HOST:PORT or unix://PATH of the server's --admin-socket", addr, example)
	}
	return addr, nil
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// AdminFrom is the client of cmd's --admin flag (its own, or a parent's
// persistent one). Without --admin it is the server's admin socket in
// --data-dir when a server answers there (SPIRE's model: the socket's
// mode is the authority, so changes need no token), else the flag's
// default; an --admin given, even the default address, is used as is.
func AdminFrom(cmd *cobra.Command, c *AdminClient) *AdminClient {
	f := cmd.Flag("admin")
	if f == nil {
		return c
	}
	c.Addr = f.Value.String()
	if !f.Changed {
		sock, err := c.LocalSocket()
		switch {
		case err != nil:
			fmt.Fprintf(cmd.ErrOrStderr(), "warning: not using the admin socket: %v; using %s with the admin token\n", err, c.Addr)
		case sock != "":
			c.Addr = sock
		}
	}
	return c
}

// maxSocketPath is the size of sun_path on Linux, the NUL included.
const maxSocketPath = 108

// LocalSocket is "unix://PATH" of the admin socket a server answers on in
// c.DataDir (./data when unset), which --admin-socket auto creates. A
// path that is no socket, or one nothing answers on (a crashed server's),
// or that this user may not open, is not offered ("" and no error). A
// socket another user could have put there is not offered either, with an
// error saying why (socketTrusted): its answers would be taken for the
// server's.
func (c *AdminClient) LocalSocket() (string, error) {
	dir := c.DataDir
	if dir == "" {
		dir = "./data"
	}
	path := filepath.Join(dir, server.AdminSocketName)
	// The absolute path, for messages, unless it passes the length limit
	// of socket paths that the relative one (as the server bound it)
	// keeps under.
	if abs, err := filepath.Abs(path); err == nil && len(abs) < maxSocketPath {
		path = abs
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
		return "", nil
	}
	if err := socketTrusted(path, os.Geteuid(), statOwner); err != nil {
		return "", err
	}
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return "", nil
	}
	_ = conn.Close()
	return "unix://" + path, nil
}

// ownerStat is the owner's uid and the mode of path, not following a
// final symbolic link.
type ownerStat func(path string) (uid int, mode fs.FileMode, err error)

// statOwner is ownerStat of the file system.
func statOwner(path string) (int, fs.FileMode, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("%s: no owner known", path)
	}
	return int(st.Uid), fi.Mode(), nil
}

// socketTrusted says why the admin socket at path cannot be taken for the
// server's, nil when it can: the socket and its directory must be owned by
// euid (this CLI's user) or root, or by anyone when the CLI runs as root,
// and the directory must not be writable by group or others, who could
// otherwise put their own socket there.
func socketTrusted(path string, euid int, stat ownerStat) error {
	dir := filepath.Dir(path)
	// The directory itself, when a symbolic link names it: the socket is
	// in the directory it points to.
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	for _, p := range []string{path, dir} {
		uid, mode, err := stat(p)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", path, err)
		case euid != 0 && uid != 0 && uid != euid:
			return fmt.Errorf("%s is owned by uid %d, neither you (uid %d) nor root; give --admin unix://%s if you trust it", p, uid, euid, path)
		case p == dir && mode.Perm()&0o022 != 0:
			return fmt.Errorf("its directory %s is writable by group or others (mode %04o), who could put their own socket there; chmod go-w it, or give --admin unix://%s if you trust it", dir, mode.Perm(), path)
		}
	}
	return nil
}

// MayAuthenticate says the token can go with a read that tells more
// with it (explain reads service account labels only for the admin): the
// token is readable and the address safe for it. The admin socket needs
// none.
func (c *AdminClient) MayAuthenticate() bool {
	if strings.HasPrefix(c.Addr, "unix://") || TokenTransportOK(c.Addr) != nil {
		return false
	}
	_, err := c.Token()
	return err == nil
}
