package authn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestParseAuthorization(t *testing.T) {
	long := strings.Repeat("a", MaxTokenSize)
	tests := []struct {
		name   string
		value  string
		want   string
		errHas string
	}{
		{name: "bearer", value: "Bearer abc.def-ghi_jkl", want: "abc.def-ghi_jkl"},
		{name: "scheme case-insensitive", value: "bEaReR tok", want: "tok"},
		{name: "lowercase", value: "bearer tok==", want: "tok=="},
		{name: "extra spaces", value: "  Bearer   tok  ", want: "tok"},
		{name: "tab separator", value: "Bearer\ttok", want: "tok"},
		{name: "longest token", value: "Bearer " + long, want: long},
		{name: "empty", value: "", errHas: "not Bearer"},
		{name: "scheme only", value: "Bearer", errHas: "empty"},
		{name: "scheme and spaces", value: "Bearer   ", errHas: "empty"},
		{name: "basic", value: "Basic dXNlcjpwYXNz", errHas: "not Bearer"},
		{name: "no scheme", value: "abcdefghijklmnopqrstuvwxyz", errHas: "not Bearer"},
		{name: "prefix without separator", value: "Bearertok", errHas: "not Bearer"},
		{name: "space inside token", value: "Bearer tok en", errHas: "b64token"},
		{name: "comma in token", value: "Bearer tok,en", errHas: "b64token"},
		{name: "padding only", value: "Bearer ===", errHas: "b64token"},
		{name: "padding in the middle", value: "Bearer a=b", errHas: "b64token"},
		{name: "non-ASCII", value: "Bearer tök", errHas: "b64token"},
		{name: "too long", value: "Bearer " + long + "a", errHas: "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAuthorization(tt.value)
			if tt.errHas != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.errHas)
				assert.Empty(t, got)
				if fields := strings.Fields(tt.value); len(fields) > 0 && len(fields[len(fields)-1]) > 3 {
					assert.NotContains(t, err.Error(), fields[len(fields)-1], "error echoes the token")
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestFromGRPC(t *testing.T) {
	ca := testca.New(t, "example.org")
	leaf, _ := ca.Issue(t, workloadID)
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}
	tlsPeer := &peer.Peer{Addr: addr, AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf, ca.Cert}}}}

	tests := []struct {
		name      string
		peer      *peer.Peer
		md        metadata.MD
		want      Request
		wantError string
	}{
		{name: "nothing"},
		{name: "peer without TLS", peer: &peer.Peer{Addr: addr}, want: Request{Peer: "127.0.0.1:5555"}},
		{name: "TLS peer", peer: tlsPeer, want: Request{Peer: "127.0.0.1:5555", PeerCertificates: []*x509.Certificate{leaf, ca.Cert}}},
		{name: "bearer token", md: metadata.Pairs("authorization", "Bearer tok"), want: Request{BearerToken: "tok"}},
		{name: "upper-case key", md: metadata.MD{"Authorization": []string{"Bearer tok"}}, want: Request{BearerToken: "tok"}},
		{name: "everything", peer: tlsPeer, md: metadata.Pairs("authorization", "Bearer tok"), want: Request{Peer: "127.0.0.1:5555", PeerCertificates: []*x509.Certificate{leaf, ca.Cert}, BearerToken: "tok"}},
		{name: "two values", md: metadata.Pairs("authorization", "Bearer one", "authorization", "Bearer two"), wantError: "2 values"},
		{name: "other scheme", md: metadata.Pairs("authorization", "Basic dXNlcjpwYXNz"), wantError: "not Bearer"},
		{name: "other metadata ignored", md: metadata.Pairs("x-token", "Bearer tok")},
		// Istio's agents send "ClusterID"; gRPC lowercases the key.
		{name: "cluster id", md: metadata.MD{"clusterid": []string{"east"}}, want: Request{ClusterIDs: []string{"east"}}},
		{name: "cluster id from Istio's key", md: metadata.Pairs("ClusterID", "east"), want: Request{ClusterIDs: []string{"east"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.peer != nil {
				ctx = peer.NewContext(ctx, tt.peer)
			}
			if tt.md != nil {
				ctx = metadata.NewIncomingContext(ctx, tt.md)
			}
			got := FromGRPC(ctx)
			if tt.wantError != "" {
				require.Error(t, got.AuthorizationError)
				assert.Contains(t, got.AuthorizationError.Error(), tt.wantError)
				assert.Empty(t, got.BearerToken)
				got.AuthorizationError = nil
			} else {
				assert.NoError(t, got.AuthorizationError)
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestFromGRPCOverTLS runs a real gRPC server on loopback that requests but
// does not verify client certificates, and checks what FromGRPC sees, and
// that the chain then decides.
func TestFromGRPCOverTLS(t *testing.T) {
	ca := testca.New(t, "example.org")
	serverCert, serverKey := ca.Issue(t, spiffeIDFor("server"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.DNSNames = []string{"localhost"}
	}})
	clientCert, clientKey := ca.Issue(t, workloadID)

	seen := make(chan Request, 4)
	auth := Chain{NewX509SVID(localTD, ca.Bundle(), nil)}
	idSeen := make(chan Identity, 4)
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{
			MinVersion:   tls.VersionTLS13,
			ClientAuth:   tls.RequestClientCert,
			Certificates: []tls.Certificate{{Certificate: [][]byte{serverCert.Raw}, PrivateKey: serverKey, Leaf: serverCert}},
		})),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			r := FromGRPC(ctx)
			seen <- r
			id, _ := auth.Authenticate(ctx, r)
			idSeen <- id
			return handler(ctx, req)
		}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	dial := func(t *testing.T, certs []tls.Certificate) healthpb.HealthClient {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			MinVersion:   tls.VersionTLS13,
			RootCAs:      pool,
			ServerName:   "localhost",
			Certificates: certs,
		})))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return healthpb.NewHealthClient(conn)
	}

	t.Run("client certificate and token", func(t *testing.T) {
		c := dial(t, []tls.Certificate{{Certificate: [][]byte{clientCert.Raw, ca.Cert.Raw}, PrivateKey: clientKey}})
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer some-token")
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		r := <-seen
		require.Len(t, r.PeerCertificates, 2)
		assert.True(t, r.PeerCertificates[0].Equal(clientCert))
		assert.Equal(t, "some-token", r.BearerToken)
		assert.True(t, strings.HasPrefix(r.Peer, "127.0.0.1:"), r.Peer)
		assert.Equal(t, Identity{ID: workloadID, Method: MethodX509SVID}, idOnly(<-idSeen))
	})
	t.Run("no client certificate, two tokens", func(t *testing.T) {
		c := dial(t, nil)
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer a", "authorization", "Bearer b")
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		r := <-seen
		assert.Empty(t, r.PeerCertificates)
		assert.Empty(t, r.BearerToken)
		assert.Error(t, r.AuthorizationError)
		assert.Zero(t, <-idSeen)
	})
}
