package trust_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func tlsCert(t *testing.T, ca *testca.CA, id spiffeid.ID) *tls.Certificate {
	t.Helper()
	leaf, key := ca.Issue(t, id)
	return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

type result struct {
	client    tls.ConnectionState
	clientErr error
	serverErr error
}

// handshake runs one TLS connection over 127.0.0.1. The server writes one
// byte after its handshake and the client reads it, so a TLS 1.3 server's
// rejection of the client certificate (sent after the client's handshake
// returned) and its session tickets both reach the client.
func handshake(t *testing.T, client, server *tls.Config) result {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	serverErr := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			serverErr <- err
			return
		}
		defer conn.Close()
		tc := tls.Server(conn, server)
		if err := tc.HandshakeContext(ctx); err != nil {
			serverErr <- err
			return
		}
		_, err = tc.Write([]byte{1})
		serverErr <- err
	}()

	var res result
	d := tls.Dialer{Config: client}
	conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err == nil {
		tc := conn.(*tls.Conn)
		var b [1]byte
		_, err = tc.Read(b[:])
		res.client = tc.ConnectionState()
		conn.Close()
	}
	res.clientErr = err
	res.serverErr = <-serverErr
	return res
}

type peers struct {
	caA, caB    *testca.CA
	clientStore *trust.Store // trusts b.test (the server)
	serverCfg   *tls.Config  // a plain server in b.test
	clientCfg   *tls.Config  // accepts only spiffe://b.test/workload
	serverCert  atomic.Pointer[tls.Certificate]
}

// newPeers sets up a server in b.test and a client in a.test that accepts
// only spiffe://b.test/workload as its server.
func newPeers(t *testing.T) *peers {
	p := &peers{caA: testca.New(t, "a.test"), caB: testca.New(t, "b.test")}
	p.clientStore = storeWith(p.caB)
	p.serverCert.Store(tlsCert(t, p.caB, idB))
	clientCert := tlsCert(t, p.caA, idA)
	p.serverCfg = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return p.serverCert.Load(), nil
		},
	}
	p.clientCfg = trust.ClientTLSConfig(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return clientCert, nil
	}, &trust.Verifier{Bundles: p.clientStore, Authorizer: tlsconfig.AuthorizeID(idB)})
	return p
}

func TestTLSServerAuthentication(t *testing.T) {
	p := newPeers(t)
	res := handshake(t, p.clientCfg, p.serverCfg)
	require.NoError(t, res.clientErr)
	require.NoError(t, res.serverErr)
	require.NotEmpty(t, res.client.PeerCertificates)
	assert.Equal(t, idB.String(), res.client.PeerCertificates[0].URIs[0].String())

	t.Run("server rotates to a root added to the client's store later", func(t *testing.T) {
		caB2 := testca.New(t, "b.test")
		p.serverCert.Store(tlsCert(t, caB2, idB))
		res := handshake(t, p.clientCfg, p.serverCfg)
		assert.ErrorIs(t, res.clientErr, trust.ErrChain, "not trusted yet")
		p.clientStore.Set("rotation", caB2.Bundle())
		res = handshake(t, p.clientCfg, p.serverCfg)
		assert.NoError(t, res.clientErr)
		assert.NoError(t, res.serverErr)
		p.serverCert.Store(tlsCert(t, p.caB, idB))
	})
}

func TestTLSRejections(t *testing.T) {
	serverCert := func(t *testing.T, ca *testca.CA, id spiffeid.ID, mutate func(*x509.Certificate)) *tls.Certificate {
		leaf, key := ca.Issue(t, id, testca.Options{Mutate: mutate})
		return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, p *peers) *tls.Config // the client's config; nil: p.clientCfg
		want  error
	}{
		{name: "server identity not authorized", want: trust.ErrUnauthorized, setup: func(t *testing.T, p *peers) *tls.Config {
			p.serverCert.Store(tlsCert(t, p.caB, spiffeid.RequireFromString("spiffe://b.test/impostor")))
			return nil
		}},
		{name: "server cert of a.test signed by b.test root, both trusted", want: trust.ErrChain, setup: func(t *testing.T, p *peers) *tls.Config {
			p.clientStore.Set("fed", p.caA.Bundle())
			p.serverCert.Store(tlsCert(t, p.caB, idA))
			return trust.ClientTLSConfig(nil, &trust.Verifier{Bundles: p.clientStore, Authorizer: tlsconfig.AuthorizeAny()})
		}},
		{name: "server presents a CA certificate", want: trust.ErrNotSVID, setup: func(t *testing.T, p *peers) *tls.Config {
			p.serverCert.Store(serverCert(t, p.caB, idB, func(c *x509.Certificate) { c.IsCA = true }))
			return nil
		}},
		{name: "server certificate for client use only", want: trust.ErrChain, setup: func(t *testing.T, p *peers) *tls.Config {
			p.serverCert.Store(serverCert(t, p.caB, idB, func(c *x509.Certificate) {
				c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
			}))
			return nil
		}},
		{name: "nil authorizer", want: trust.ErrUnauthorized, setup: func(t *testing.T, p *peers) *tls.Config {
			return trust.ClientTLSConfig(nil, &trust.Verifier{Bundles: p.clientStore})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPeers(t)
			client := tt.setup(t, p)
			if client == nil {
				client = p.clientCfg
			}
			res := handshake(t, client, p.serverCfg)
			assert.ErrorIs(t, res.clientErr, tt.want)
		})
	}
}

func TestTLSRootRemovedFailsNewHandshakes(t *testing.T) {
	p := newPeers(t)
	require.NoError(t, handshake(t, p.clientCfg, p.serverCfg).clientErr)
	p.clientStore.Remove("test", tdB)
	res := handshake(t, p.clientCfg, p.serverCfg)
	assert.ErrorIs(t, res.clientErr, trust.ErrUnknownDomain)
}

// Resumed sessions skip VerifyPeerCertificate; they must not skip the
// store. Each case first proves that the session really resumes, then
// removes the server's root and resumes again.
func TestTLSResumedSessionRecheckedAgainstStore(t *testing.T) {
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		name := map[uint16]string{tls.VersionTLS12: "tls1.2", tls.VersionTLS13: "tls1.3"}[version]
		t.Run(name, func(t *testing.T) {
			p := newPeers(t)
			client := resumingClient(p, version)

			require.NoError(t, handshake(t, client, p.serverCfg).clientErr)
			res := handshake(t, client, p.serverCfg)
			require.NoError(t, res.clientErr)
			require.True(t, res.client.DidResume, "the cached session is resumed")

			p.clientStore.Remove("test", tdB)
			res = handshake(t, client, p.serverCfg)
			assert.ErrorIs(t, res.clientErr, trust.ErrUnknownDomain)
		})
	}
	t.Run("helper default never resumes", func(t *testing.T) {
		p := newPeers(t)
		require.NoError(t, handshake(t, p.clientCfg, p.serverCfg).clientErr)
		res := handshake(t, p.clientCfg, p.serverCfg)
		require.NoError(t, res.clientErr)
		assert.False(t, res.client.DidResume)
	})
}

// resumingClient is p's client config with a session cache, so a second
// handshake resumes when the server allows it.
func resumingClient(p *peers, version uint16) *tls.Config {
	client := p.clientCfg.Clone()
	client.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	client.ServerName = "server.test"
	client.MaxVersion = version
	return client
}
