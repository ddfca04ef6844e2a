//go:build linux

package attest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffegrpc/grpccredentials"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// tlsPKI is a trust domain with a server and a client SVID, and another
// trust domain with a client SVID of its own.
type tlsPKI struct {
	bundle, otherBundle *x509bundle.Bundle
	server, client      *x509svid.SVID
	stranger            *x509svid.SVID
}

func newTLSPKI(t *testing.T) *tlsPKI {
	t.Helper()
	ca := testca.New(t, "example.org")
	other := testca.New(t, "other.org")
	svid := func(ca *testca.CA, id string) *x509svid.SVID {
		sid := spiffeid.RequireFromString(id)
		cert, key := ca.Issue(t, sid)
		return &x509svid.SVID{ID: sid, Certificates: []*x509.Certificate{cert}, PrivateKey: key}
	}
	return &tlsPKI{
		bundle:      x509bundle.FromX509Authorities(ca.TrustDomain, []*x509.Certificate{ca.Cert}),
		otherBundle: x509bundle.FromX509Authorities(other.TrustDomain, []*x509.Certificate{other.Cert}),
		server:      svid(ca, "spiffe://example.org/agent"),
		client:      svid(ca, "spiffe://example.org/ns/istio-system/sa/ztunnel"),
		stranger:    svid(other, "spiffe://other.org/ns/istio-system/sa/ztunnel"),
	}
}

// serverConfig is what the agent serves: its SVID, members of its trust
// domain only.
func (k *tlsPKI) serverConfig() (*tls.Config, error) {
	return tlsconfig.MTLSServerConfig(k.server, k.bundle, tlsconfig.AuthorizeMemberOf(k.bundle.TrustDomain())), nil
}

// callWith makes one Health.Check call on the unix socket at path with
// creds.
func callWith(path string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	return err
}

// One socket: a plaintext caller and an mTLS caller, each attested by
// pid, the second with its SPIFFE ID.
func TestCredentialsWithTLS(t *testing.T) {
	k := newTLSPKI(t)
	p := &probe{a: newAttestor(t, Config{})}
	sock := serve(t, p, grpc.Creds(p.a.CredentialsWithTLS(k.serverConfig)))

	require.NoError(t, call(sock))
	r := <-p.got
	require.NoError(t, r.err)
	assert.Equal(t, int32(os.Getpid()), r.caller.PID)
	assert.True(t, r.caller.SVID.IsZero(), "plaintext: no SVID")
	assert.Equal(t, authType, r.caller.AuthType())

	mtls := grpccredentials.MTLSClientCredentials(k.client, k.bundle, tlsconfig.AuthorizeID(k.server.ID))
	require.NoError(t, callWith(sock, mtls))
	r = <-p.got
	require.NoError(t, r.err)
	assert.Equal(t, int32(os.Getpid()), r.caller.PID, "attested by pid as well")
	assert.Equal(t, uint32(os.Geteuid()), r.facts.Unix.UID)
	assert.Equal(t, k.client.ID, r.caller.SVID)
	assert.Equal(t, authTypeTLS, r.caller.AuthType())
	assert.NotNil(t, r.caller.pidfd)
}

// TLS callers the server's config does not verify fail the handshake:
// their calls never reach the server.
func TestCredentialsWithTLSRefused(t *testing.T) {
	k := newTLSPKI(t)
	both := x509bundle.NewSet(k.bundle, k.otherBundle)
	tests := []struct {
		name   string
		creds  credentials.TransportCredentials
		config func() (*tls.Config, error)
	}{
		{"no client certificate", grpccredentials.TLSClientCredentials(k.bundle, tlsconfig.AuthorizeID(k.server.ID)), k.serverConfig},
		{"another trust domain", grpccredentials.MTLSClientCredentials(k.stranger, both, tlsconfig.AuthorizeID(k.server.ID)), k.serverConfig},
		{"a config that verifies no client", grpccredentials.MTLSClientCredentials(k.client, k.bundle, tlsconfig.AuthorizeID(k.server.ID)),
			func() (*tls.Config, error) { return tlsconfig.TLSServerConfig(k.server), nil }},
		{"no config", grpccredentials.MTLSClientCredentials(k.client, k.bundle, tlsconfig.AuthorizeID(k.server.ID)),
			func() (*tls.Config, error) { return nil, errors.New("no SVID yet") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &probe{a: newAttestor(t, Config{})}
			sock := serve(t, p, grpc.Creds(p.a.CredentialsWithTLS(tt.config)))
			require.Error(t, callWith(sock, tt.creds))
			select {
			case r := <-p.got:
				t.Fatalf("a call was served: %+v", r)
			default:
			}
			// Plaintext on the same socket still works.
			require.NoError(t, call(sock))
			require.NoError(t, (<-p.got).err)
		})
	}
}

// A caller that connects and sends nothing is dropped at the gRPC
// server's connection timeout, and holds nobody else up meanwhile.
func TestCredentialsWithTLSSilentCaller(t *testing.T) {
	k := newTLSPKI(t)
	p := &probe{a: newAttestor(t, Config{})}
	sock := serve(t, p, grpc.Creds(p.a.CredentialsWithTLS(k.serverConfig)), grpc.ConnectionTimeout(100*time.Millisecond))

	silent, err := net.Dial("unix", sock)
	require.NoError(t, err)
	defer silent.Close()

	require.NoError(t, call(sock))
	require.NoError(t, (<-p.got).err)

	// Bounded so a server that never drops it fails the test.
	require.NoError(t, silent.SetReadDeadline(time.Now().Add(callTimeout)))
	_, err = silent.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server closed the connection")
}
