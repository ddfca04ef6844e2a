package certservice

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/trustbridge/trustbridge/ca"
)

// Limits the gRPC server applies.
const (
	// MaxRecvMsgSize bounds a request: a CSR is at most ca.MaxCSRSize,
	// plus room for the other fields and their framing.
	MaxRecvMsgSize = ca.MaxCSRSize + 16<<10
	// MaxBundleMessageSize bounds one WatchBundles message: what agents
	// accept (caclient.MaxBundleMapBytes), room for the bundles of a
	// thousand trust domains with rotations and JWT authorities under way.
	// A larger one is refused, never sent to fail at the client.
	MaxBundleMessageSize = 16 << 20
	// MaxSendMsgSize bounds a response. gRPC's limit is the server's, not
	// a method's, so it is WatchBundles' limit: a smaller one would fail
	// every send of a bundle map the agents accept. Other responses are
	// much smaller (a certificate chain and merged roots).
	MaxSendMsgSize = MaxBundleMessageSize
	// MaxConcurrentStreams bounds the calls one connection may have open;
	// a client's calls beyond it wait in the client (HTTP/2's stream
	// limit), not refused.
	MaxConcurrentStreams = 128
	// MaxHeaderListSize bounds request metadata; a bearer token is at most
	// authn.MaxTokenSize.
	MaxHeaderListSize = 32 << 10
	// ConnectionTimeout bounds the TLS handshake and HTTP/2 setup.
	ConnectionTimeout = 10 * time.Second
	// KeepaliveTime is how long a connection may be silent before the
	// server pings it, and KeepaliveTimeout how long it then waits for
	// the answer. A peer gone without closing (its node vanished, a
	// network partition) keeps its WatchBundles stream, and the slot it
	// holds of its identity's MaxBundleWatchesPerIdentity, until then:
	// with gRPC's default of two hours, a DaemonSet's agents, sharing one
	// identity, reconnecting after a network blip would be refused for
	// hours. Agents ping every caclient.KeepaliveTime while a stream is
	// open, so the server pings only quiet callers.
	KeepaliveTime    = time.Minute
	KeepaliveTimeout = 20 * time.Second
	// KeepaliveMinTime is the most often a client may ping before it is
	// disconnected; it must allow caclient.KeepaliveTime.
	KeepaliveMinTime = 10 * time.Second
	// shutdownGrace is how long Run lets calls in progress finish.
	shutdownGrace = 10 * time.Second
)

// ServerOptions are the limits for a certificate service gRPC server:
// message and header sizes, concurrent streams per connection, keepalive
// enforcement (a client pinging more often than every 10s is disconnected)
// and detection of dead peers (KeepaliveTime), and the connection setup
// timeout; and one stream worker per CPU, whose
// goroutines keep the stack a signing grew, where a goroutine per call
// grows a new one each time (about 3% of the CPU per certificate under
// load, issue 15's benchmark; calls beyond the workers, and long-lived SDS
// streams, still get a goroutine each).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxSendMsgSize(MaxSendMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.ConnectionTimeout(ConnectionTimeout),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             KeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			// Idle agents reconnect when they next need a certificate,
			// hours later; holding their connections costs memory.
			MaxConnectionIdle: 15 * time.Minute,
			Time:              KeepaliveTime,
			Timeout:           KeepaliveTimeout,
		}),
	}
}

// TLSConfig is the server side of the certificate service: the serving
// certificate from getCert on every handshake (so it rotates without a
// restart), TLS 1.2 or later, and a client certificate requested but not
// verified by crypto/tls: the authenticator verifies it on every call
// against the roots of that moment, and a caller without one may still
// present a bearer token. Session tickets are off, so no call rides on a
// handshake made under roots since removed.
func TLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS12,
		GetCertificate:         getCert,
		ClientAuth:             tls.RequestClientCert,
		SessionTicketsDisabled: true,
	}
}

// Server runs a Service on a listener.
type Server struct {
	grpc *grpc.Server
	ln   net.Listener
	svc  *Service
}

// NewServer returns a gRPC server on ln with ServerOptions, TLS from
// tlsConfig, and svc registered. extra options are applied after ours.
func NewServer(svc *Service, tlsConfig *tls.Config, ln net.Listener, extra ...grpc.ServerOption) *Server {
	opts := append(ServerOptions(), grpc.Creds(credentials.NewTLS(tlsConfig)))
	opts = append(opts, extra...)
	g := grpc.NewServer(opts...)
	svc.Register(g)
	return &Server{grpc: g, ln: ln, svc: svc}
}

// Registrar is where other services sharing the listener and its
// authentication (the SDS server) register, before Run.
func (s *Server) Registrar() grpc.ServiceRegistrar { return s.grpc }

// Addr is the listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Run serves until ctx is done, then lets calls in progress finish for a
// few seconds before closing every connection.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(s.ln) }()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("certservice: %w", err)
		}
		return nil
	case <-ctx.Done():
	}
	// Bundle streams never end by themselves; a graceful stop waits for
	// calls in progress only.
	s.svc.stopWatches()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(shutdownGrace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		s.grpc.Stop()
		<-stopped
	}
	<-errc
	return nil
}
