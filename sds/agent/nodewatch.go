package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/trustbridge/trustbridge/internal/caclient"
)

// nodeConn is the node agent's one connection to the certificate service
// for its workloads' trust streams (one stream per workload identity held,
// all on it): the server verified with the node's current roots and
// SPIFFE ID at every handshake, no client certificate (the server lets a
// node act for its workloads on its token alone), and the node's token,
// re-read, on every stream.
func nodeConn(addr string, node func() (NodeCredentials, error)) (*grpc.ClientConn, error) {
	tlsCfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified in VerifyConnection as an X509-SVID; host names play
		// no part.
		InsecureSkipVerify: true, //nolint:gosec // see above
		VerifyConnection: func(cs tls.ConnectionState) error {
			nc, err := node()
			if err != nil {
				return err
			}
			return caclient.VerifyServer(nc.Roots, nc.ServerID)(cs)
		},
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithPerRPCCredentials(nodeBearer(node)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: caclient.KeepaliveTime, Timeout: 10 * time.Second}),
	)
	if err != nil {
		return nil, fmt.Errorf("agent: --ca-addr %q: %w", addr, err)
	}
	return conn, nil
}

// nodeBearer is the node's token as gRPC per-RPC credentials, read at
// every call (a projected token is rotated in place), only over TLS.
type nodeBearer func() (NodeCredentials, error)

func (n nodeBearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	nc, err := n()
	if err != nil {
		return nil, err
	}
	if nc.Token == "" {
		return nil, errors.New("the node has no token (--token-file): the server lets a node act for its workloads only on its token")
	}
	return caclient.BearerToken(nc.Token).GetRequestMetadata(context.Background())
}

func (nodeBearer) RequireTransportSecurity() bool { return true }

// streamsPerConn is the most workload trust streams one connection
// carries. trustbridge's certificate service serves at most 128 calls
// per connection (certservice.MaxConcurrentStreams); a stream past the
// server's limit would wait for a slot for as long as it lived, so the
// node spreads its up to 1,000 identities' streams over connections with
// room to spare.
const streamsPerConn = 100

// nodeConns is the node's connections to the certificate service for its
// workloads' trust streams, each carrying at most streamsPerConn.
type nodeConns struct {
	dial func() (*grpc.ClientConn, error)

	mu     sync.Mutex
	conns  []*pooledConn
	closed bool
}

type pooledConn struct {
	conn    *grpc.ClientConn
	streams int
}

// take returns a connection with room for one more stream, dialing one
// when none has.
func (p *nodeConns) take() (*pooledConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("the agent is stopping")
	}
	for _, c := range p.conns {
		if c.streams < streamsPerConn {
			c.streams++
			return c, nil
		}
	}
	conn, err := p.dial()
	if err != nil {
		return nil, err
	}
	c := &pooledConn{conn: conn, streams: 1}
	p.conns = append(p.conns, c)
	return c, nil
}

// put gives a stream's room back.
func (p *nodeConns) put(c *pooledConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.streams--
}

// Close closes every connection.
func (p *nodeConns) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.conn.Close()
	}
	p.conns = nil
}

// trustWatchOn follows each workload's trust on WatchBundles, on a
// connection of conns, acting for the workload with its peer limits: the
// server's decision for it, which the agent enforces.
func trustWatchOn(conns *nodeConns, issuer *jwtIssuerCell, taints *taintCell, log *slog.Logger) trustWatchFunc {
	return func(ctx context.Context, id spiffeid.ID, fn func(workloadTrust, error) error) error {
		pc, err := conns.take()
		if err != nil {
			return err
		}
		defer conns.put(pc)
		opts := caclient.WatchOptions{Impersonate: id, PeerLimits: true}
		return caclient.WatchBundlesWith(ctx, pc.conn, id.TrustDomain(), opts, func(b *caclient.Bundles, err error) error {
			if err != nil {
				return fn(workloadTrust{}, err)
			}
			issuer.take(id.TrustDomain(), b, log)
			taints.take(b, log)
			return fn(workloadTrust{Bundles: b.Bundles, PeerLimits: b.PeerLimits}, nil)
		})
	}
}
