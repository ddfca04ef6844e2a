package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/sds"
)

// socketState is what probeSocket found on a socket path.
type socketState int

const (
	// socketNone: nothing answers (no file, a stale socket, or a peer
	// that accepts but does not speak gRPC).
	socketNone socketState = iota
	// socketSDS: a gRPC server answers SDS.
	socketSDS
	// socketOtherGRPC: a gRPC server answers, without SDS.
	socketOtherGRPC
)

// probeSocket asks whatever listens at path for ROOTCA with FetchSecrets,
// and on Unimplemented with StreamSecrets. A server that completes the
// HTTP/2 handshake and answers anything but Unimplemented to both is a
// live SDS server, whether or not it has ROOTCA (an error status is still
// an answer); Unimplemented to both is some other gRPC server. A refused connection, or a peer that accepts but does not speak
// gRPC within timeout, is nothing.
func probeSocket(ctx context.Context, path string, timeout time.Duration) (socketState, error) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != fs.ModeSocket {
		return socketNone, nil
	}
	conn, err := grpc.NewClient("passthrough:///sds-probe",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
	)
	if err != nil {
		return socketNone, fmt.Errorf("probing %s: %w", path, err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := secretv3.NewSecretDiscoveryServiceClient(conn)
	req := &discoveryv3.DiscoveryRequest{
		Node:          &corev3.Node{Id: "trustbridge-agent-probe"},
		TypeUrl:       resourcev3.SecretType,
		ResourceNames: []string{sds.RootCAName},
	}
	_, err = client.FetchSecrets(cctx, req)
	code := status.Code(err)
	if code == codes.Unimplemented {
		// Istio's agent serves SDS streams but not FetchSecrets; only a
		// stream refused as Unimplemented too means no SDS at all.
		code = probeStream(cctx, client, req)
	}
	if ctx.Err() != nil {
		return socketNone, ctx.Err()
	}
	switch code {
	case codes.OK:
		return socketSDS, nil
	case codes.Unimplemented:
		return socketOtherGRPC, nil
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		// Either the transport failed or the server said so; a READY
		// connection means a gRPC server answered.
		if conn.GetState() == connectivity.Ready {
			return socketSDS, nil
		}
		return socketNone, nil
	default:
		return socketSDS, nil
	}
}

// probeStream asks for req on an SDS stream and returns the status code of
// the first answer (OK for a response).
func probeStream(ctx context.Context, client secretv3.SecretDiscoveryServiceClient, req *discoveryv3.DiscoveryRequest) codes.Code {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.StreamSecrets(ctx)
	if err != nil {
		return status.Code(err)
	}
	if err := st.Send(req); err != nil {
		_, err = st.Recv() // the stream's real status
		return status.Code(err)
	}
	_, err = st.Recv()
	return status.Code(err)
}

// socketListener is a unix listener that removes its socket on Close, if
// the path still names the socket it created.
type socketListener struct {
	*net.UnixListener
	path string
	fi   fs.FileInfo
}

// Close stops listening and removes the socket.
func (l *socketListener) Close() error {
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

// maxSocketPath is the size of sun_path on Linux, including the NUL.
const maxSocketPath = 108

// listenSocket creates the SDS socket at path.
//
// Parent directories are created 0750. Something already at path is
// removed only when it is a socket (Lstat: never a regular file, directory
// or symlink) and nothing answers on it.
//
// The socket is never reachable with a wider mode than intended: it is
// bound inside a fresh 0700 directory next to path, chmod'ed (0600, or
// 0660 and chown'ed to gid when gid >= 0), and only then hard-linked to
// path, which also fails rather than replace anything that appeared at
// path meanwhile. The temporary directory (and its link) is removed
// before listenSocket returns, so the bound socket's name is path from
// then on.
func listenSocket(ctx context.Context, path string, gid int, probeTimeout time.Duration) (*socketListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil:
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket (%s); refusing to replace it", path, fi.Mode().Type())
		}
		st, err := probeSocket(ctx, path, probeTimeout)
		if err != nil {
			return nil, err
		}
		if st != socketNone {
			return nil, fmt.Errorf("%w: %s", ErrAlreadyServing, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("socket path: %w", err)
	}

	tmp, err := os.MkdirTemp(dir, ".sds")
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	defer os.RemoveAll(tmp)
	tmpPath := filepath.Join(tmp, "s")
	if len(tmpPath) >= maxSocketPath {
		return nil, fmt.Errorf("socket path %s is too long: the socket is first bound at %s, over the %d-byte limit of unix socket paths", path, tmpPath, maxSocketPath-1)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmpPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	// The name bound is the temporary one; Close removes path itself.
	ln.SetUnlinkOnClose(false)
	mode := os.FileMode(0o600)
	if gid >= 0 {
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
	fi, err = os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	return &socketListener{UnixListener: ln, path: path, fi: fi}, nil
}
