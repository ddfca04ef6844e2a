package bundleserver_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// webServer serves a 1-key bundle with a Web PKI certificate from a fresh
// CA, returning the server, its address and a pool trusting it.
func webServer(t *testing.T, cfg bundleserver.Config) (*bundleserver.Server, string, *tls.Config) {
	t.Helper()
	web := testca.New(t, "webpki.test")
	if cfg.Local == nil {
		cfg.Local = newSource(newBundle(t, td, 1, 1, 0))
	}
	if cfg.GetCertificate == nil {
		cfg.GetCertificate = fixedCert(webCert(t, web))
	}
	s := newServer(t, cfg)
	u := serve(t, s)
	return s, u.Host, &tls.Config{RootCAs: pool(web.Cert), ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

func TestTLSPolicy(t *testing.T) {
	_, addr, base := webServer(t, bundleserver.Config{})
	for _, tc := range []struct {
		name string
		edit func(*tls.Config)
		ok   bool
	}{
		{"TLS 1.3", func(c *tls.Config) {}, true},
		{"TLS 1.2 with AES-GCM", func(c *tls.Config) {
			c.MaxVersion = tls.VersionTLS12
			c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
		}, true},
		{"TLS 1.2 with ChaCha20", func(c *tls.Config) {
			c.MaxVersion = tls.VersionTLS12
			c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}
		}, true},
		{"TLS 1.2 with CBC only", func(c *tls.Config) {
			c.MaxVersion = tls.VersionTLS12
			c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256}
		}, false},
		{"TLS 1.1", func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS10, tls.VersionTLS11 }, false},
		{"P-521 only", func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.CurveP521} }, false},
		{"P-256 only", func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.CurveP256} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base.Clone()
			asked := false
			// Called only if the server requests a client certificate,
			// which a bundle endpoint must never do.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				asked = true
				return &tls.Certificate{}, nil
			}
			tc.edit(cfg)
			conn, err := tls.Dial("tcp", addr, cfg)
			if !tc.ok {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			defer conn.Close()
			assert.False(t, asked, "client certificate requested")
		})
	}
}

// TestExtraNextProtos: ACME's TLS-ALPN-01 challenge needs its protocol
// offered on the serving listener.
func TestExtraNextProtos(t *testing.T) {
	_, addr, base := webServer(t, bundleserver.Config{NextProtos: []string{"acme-tls/1", "h2"}})
	for _, proto := range []string{"acme-tls/1", "h2", "http/1.1"} {
		cfg := base.Clone()
		cfg.NextProtos = []string{proto}
		conn, err := tls.Dial("tcp", addr, cfg)
		require.NoError(t, err)
		assert.Equal(t, proto, conn.ConnectionState().NegotiatedProtocol)
		conn.Close()
	}
}

// TestCertificateRotation: a new certificate from GetCertificate is served
// from the next handshake on, without a restart.
func TestCertificateRotation(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	certA, certB := webCert(t, caA), webCert(t, caB)
	var cur rotatingCert
	cur.p.Store(certA)
	_, addr, base := webServer(t, bundleserver.Config{GetCertificate: cur.get})
	base.RootCAs = pool(caA.Cert, caB.Cert)

	leaf := func() []byte {
		conn, err := tls.Dial("tcp", addr, base.Clone())
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}
	assert.Equal(t, certA.Leaf.Raw, leaf())
	cur.p.Store(certB)
	assert.Equal(t, certB.Leaf.Raw, leaf())
}

// TestSlowClientsAreCutOff: a client that stalls in the handshake or in
// the request headers is disconnected after ReadHeaderTimeout. Every other
// timeout is an hour, so a connection the server closes at all was closed
// by ReadHeaderTimeout: the test waits for that close, not on a clock.
func TestSlowClientsAreCutOff(t *testing.T) {
	_, addr, base := webServer(t, bundleserver.Config{Timeouts: bundleserver.Timeouts{
		ReadHeader: 200 * time.Millisecond,
		Read:       time.Hour,
		Write:      time.Hour,
		Idle:       time.Hour,
	}})

	// waitClosed reads until the server closes; the deadline only keeps a
	// broken server from hanging the test.
	waitClosed := func(t *testing.T, c net.Conn) {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
		_, err := io.Copy(io.Discard, c)
		assert.False(t, isTimeout(err), "server kept the connection open: %v", err)
	}

	t.Run("partial request headers", func(t *testing.T) {
		cfg := base.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		conn, err := tls.Dial("tcp", addr, cfg)
		require.NoError(t, err)
		defer conn.Close()
		_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
		require.NoError(t, err)
		waitClosed(t, conn)
	})
	t.Run("no handshake", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte{0x16, 0x03, 0x01}) // the start of a record
		require.NoError(t, err)
		waitClosed(t, conn)
	})
	t.Run("headers that never end are refused", func(t *testing.T) {
		cfg := base.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		conn, err := tls.Dial("tcp", addr, cfg)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
		big := "GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: "
		for len(big) < 2*bundleserver.MaxHeaderBytes+4096 {
			big += "aaaaaaaaaaaaaaaa"
		}
		_, _ = io.WriteString(conn, big+"\r\n\r\n") // may fail once the server gives up
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	})
}

// TestSlowReadersDoNotStarveOthers: connections that pipeline requests and
// never read their responses do not stop another client from being
// served.
func TestSlowReadersDoNotStarveOthers(t *testing.T) {
	const (
		flooders = 32
		requests = 200 // each, pipelined and never read
	)
	_, addr, base := webServer(t, bundleserver.Config{
		Local:    newSource(newBundle(t, td, 10, 1, 0)),
		Timeouts: bundleserver.Timeouts{Write: time.Second},
	})

	var (
		wg    sync.WaitGroup
		conns = make(chan net.Conn, flooders)
	)
	req := "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
	for range flooders {
		wg.Go(func() {
			raw, err := net.Dial("tcp", addr)
			if !assert.NoError(t, err) {
				return
			}
			_ = raw.(*net.TCPConn).SetReadBuffer(4096)
			cfg := base.Clone()
			cfg.NextProtos = []string{"http/1.1"}
			conn := tls.Client(raw, cfg)
			conns <- conn
			_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			for range requests {
				if _, err := io.WriteString(conn, req); err != nil {
					return // the server gave up on us: fine
				}
			}
		})
	}
	wg.Wait()
	close(conns)
	defer func() {
		for c := range conns {
			c.Close()
		}
	}()

	c := &http.Client{Transport: &http.Transport{TLSClientConfig: base.Clone()}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	for i := range 5 {
		resp, err := c.Get(fmt.Sprintf("https://%s/?i=%d", addr, i))
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
}

// TestHTTP2 checks that HTTP/2 is offered and that its stream limit is
// the configured one, reading the server's SETTINGS frame by hand.
func TestHTTP2(t *testing.T) {
	_, addr, base := webServer(t, bundleserver.Config{MaxConcurrentStreams: 17})

	cfg := base.Clone()
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", addr, cfg)
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "h2", conn.ConnectionState().NegotiatedProtocol)
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	require.NoError(t, err)
	_, err = conn.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}) // empty SETTINGS
	require.NoError(t, err)

	var hdr [9]byte
	_, err = io.ReadFull(conn, hdr[:])
	require.NoError(t, err)
	require.Equal(t, byte(4), hdr[3], "first frame is SETTINGS")
	payload := make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
	_, err = io.ReadFull(conn, payload)
	require.NoError(t, err)
	settings := map[uint16]uint32{}
	for p := payload; len(p) >= 6; p = p[6:] {
		settings[binary.BigEndian.Uint16(p)] = binary.BigEndian.Uint32(p[2:])
	}
	assert.Equal(t, uint32(17), settings[0x3], "SETTINGS_MAX_CONCURRENT_STREAMS")

	// And a real HTTP/2 client is served.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: base.Clone(), ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + addr + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, resp.ProtoMajor)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestServeLifecycle(t *testing.T) {
	t.Run("shuts down on cancel and closes the listener", func(t *testing.T) {
		web := testca.New(t, "webpki.test")
		s := newServer(t, bundleserver.Config{Local: newSource(newBundle(t, td, 1, 1, 0)), GetCertificate: fixedCert(webCert(t, web))})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, ln) }()

		c := client(t, pool(web.Cert), false)
		resp, err := c.Get("https://" + ln.Addr().String() + "/")
		require.NoError(t, err)
		resp.Body.Close()

		cancel()
		require.NoError(t, <-done)
		_, err = net.Dial("tcp", ln.Addr().String())
		assert.Error(t, err, "listener closed")
	})
	t.Run("needs a certificate", func(t *testing.T) {
		s := newServer(t, bundleserver.Config{Local: newSource(nil)})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		err = s.Serve(context.Background(), ln)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "GetCertificate")
		_, err = ln.Accept()
		assert.True(t, errors.Is(err, net.ErrClosed))
	})
}
