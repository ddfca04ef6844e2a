package agent

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
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

	"github.com/trustbridge/trustbridge/internal/netutil"
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

// listenSocket creates the SDS socket at path (see unixsock.Listen),
// replacing a socket there only when no gRPC server answers on it.
func listenSocket(ctx context.Context, path string, gid int, probeTimeout time.Duration) (*netutil.UnixListener, error) {
	return netutil.ListenUnix(path, gid, func(path string) error {
		st, err := probeSocket(ctx, path, probeTimeout)
		if err != nil {
			return err
		}
		if st != socketNone {
			return fmt.Errorf("%w: %s", ErrAlreadyServing, path)
		}
		return nil
	})
}
