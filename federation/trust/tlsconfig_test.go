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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testca"
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
	caA, caB             *testca.CA
	serverStore          *trust.Store // trusts a.test (clients) and b.test
	clientStore          *trust.Store // trusts b.test (the server)
	serverCfg, clientCfg *tls.Config
	serverSeen           atomic.Value // spiffeid.ID the server's authorizer saw
	serverCert           atomic.Pointer[tls.Certificate]
}

// newPeers sets up a server in b.test that accepts any member of a.test and
// a client in a.test that accepts only spiffe://b.test/workload.
func newPeers(t *testing.T) *peers {
	p := &peers{caA: testca.New(t, "a.test"), caB: testca.New(t, "b.test")}
	p.serverStore = storeWith(p.caA, p.caB)
	p.clientStore = storeWith(p.caB)
	p.serverCert.Store(tlsCert(t, p.caB, idB))
	clientCert := tlsCert(t, p.caA, idA)

	member := trust.AuthorizeMemberOf(tdA)
	p.serverCfg = trust.ServerTLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return p.serverCert.Load(), nil
	}, &trust.Verifier{Store: p.serverStore, Authorizer: func(id spiffeid.ID) error {
		p.serverSeen.Store(id)
		return member(id)
	}})
	p.clientCfg = trust.ClientTLSConfig(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return clientCert, nil
	}, &trust.Verifier{Store: p.clientStore, Authorizer: trust.AuthorizeID(idB)})
	return p
}

func TestTLSMutualAuthentication(t *testing.T) {
	p := newPeers(t)
	res := handshake(t, p.clientCfg, p.serverCfg)
	require.NoError(t, res.clientErr)
	require.NoError(t, res.serverErr)
	assert.Equal(t, idA, p.serverSeen.Load())
	require.NotEmpty(t, res.client.PeerCertificates)
	assert.Equal(t, idB.String(), res.client.PeerCertificates[0].URIs[0].String())
	assert.True(t, p.serverCfg.SessionTicketsDisabled)

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
	t.Run("server identity not authorized", func(t *testing.T) {
		p := newPeers(t)
		p.serverCert.Store(tlsCert(t, p.caB, spiffeid.RequireFromString("spiffe://b.test/impostor")))
		res := handshake(t, p.clientCfg, p.serverCfg)
		assert.ErrorIs(t, res.clientErr, trust.ErrUnauthorized)
	})
	t.Run("server cert of a.test signed by b.test root", func(t *testing.T) {
		p := newPeers(t)
		p.clientStore.Set("fed", p.caA.Bundle())
		cfg := p.clientCfg.Clone()
		cfg.VerifyConnection = trust.ClientTLSConfig(nil, &trust.Verifier{Store: p.clientStore, Authorizer: trust.AuthorizeAny()}).VerifyConnection
		p.serverCert.Store(tlsCert(t, p.caB, idA))
		res := handshake(t, cfg, p.serverCfg)
		assert.ErrorIs(t, res.clientErr, trust.ErrChain)
	})
	t.Run("client without certificate", func(t *testing.T) {
		p := newPeers(t)
		cfg := p.clientCfg.Clone()
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
		res := handshake(t, cfg, p.serverCfg)
		assert.Error(t, res.serverErr)
		assert.Error(t, res.clientErr)
	})
	t.Run("client presents a CA certificate", func(t *testing.T) {
		p := newPeers(t)
		leaf, key := p.caA.Issue(t, idA, testca.Options{Mutate: func(c *x509.Certificate) { c.IsCA = true }})
		cfg := p.clientCfg.Clone()
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}, nil
		}
		res := handshake(t, cfg, p.serverCfg)
		assert.ErrorIs(t, res.serverErr, trust.ErrNotSVID)
	})
}

func TestTLSRootRemovedFailsNewHandshakes(t *testing.T) {
	t.Run("server drops the client's trust domain", func(t *testing.T) {
		p := newPeers(t)
		require.NoError(t, handshake(t, p.clientCfg, p.serverCfg).serverErr)
		p.serverStore.Remove("test", tdA)
		res := handshake(t, p.clientCfg, p.serverCfg)
		assert.ErrorIs(t, res.serverErr, trust.ErrUnknownDomain)
		assert.Error(t, res.clientErr)
	})
	t.Run("client drops the server's trust domain", func(t *testing.T) {
		p := newPeers(t)
		require.NoError(t, handshake(t, p.clientCfg, p.serverCfg).clientErr)
		p.clientStore.Remove("test", tdB)
		res := handshake(t, p.clientCfg, p.serverCfg)
		assert.ErrorIs(t, res.clientErr, trust.ErrUnknownDomain)
	})
}

// Resumed sessions skip VerifyPeerCertificate; they must not skip the
// store. Each case first proves that the session really resumes, then
// removes the peer's root and resumes again.
func TestTLSResumedSessionRecheckedAgainstStore(t *testing.T) {
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		name := map[uint16]string{tls.VersionTLS12: "tls1.2", tls.VersionTLS13: "tls1.3"}[version]
		t.Run(name+"/client side", func(t *testing.T) {
			p := newPeers(t)
			client := resumingClient(p, version)
			server := p.serverCfg.Clone()
			server.SessionTicketsDisabled = false // a server that hands out tickets

			require.NoError(t, handshake(t, client, server).clientErr)
			res := handshake(t, client, server)
			require.NoError(t, res.clientErr)
			require.True(t, res.client.DidResume, "the cached session is resumed")

			p.clientStore.Remove("test", tdB)
			res = handshake(t, client, server)
			assert.ErrorIs(t, res.clientErr, trust.ErrUnknownDomain)
		})
		t.Run(name+"/server side", func(t *testing.T) {
			p := newPeers(t)
			client := resumingClient(p, version)
			server := p.serverCfg.Clone()
			server.SessionTicketsDisabled = false // re-enabled: VerifyConnection must still hold

			require.NoError(t, handshake(t, client, server).serverErr)
			res := handshake(t, client, server)
			require.NoError(t, res.serverErr)
			require.True(t, res.client.DidResume, "the cached session is resumed")

			p.serverStore.Remove("test", tdA)
			res = handshake(t, client, server)
			assert.ErrorIs(t, res.serverErr, trust.ErrUnknownDomain)
		})
		t.Run(name+"/helper default never resumes", func(t *testing.T) {
			p := newPeers(t)
			client := resumingClient(p, version)
			require.NoError(t, handshake(t, client, p.serverCfg).serverErr)
			res := handshake(t, client, p.serverCfg)
			require.NoError(t, res.serverErr)
			assert.False(t, res.client.DidResume)
		})
	}
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
