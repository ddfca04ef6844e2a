package servertest

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// DialFlood is a TCP connection from local to addr with a deadline of 30
// s for what follows, nil when the dial failed.
func DialFlood(addr, local string) net.Conn {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 30 * time.Second}
	raw, err := d.Dial("tcp", addr)
	if err != nil {
		// The kernel completes the handshake before the server accepts;
		// the server's reset may still beat connect's return.
		return nil
	}
	_ = raw.SetDeadline(time.Now().Add(30 * time.Second))
	return raw
}

// DialIdleH2 is a FloodH2 connection from local to addr, nil when the
// server refused it. It touches no testing.TB, for the flood's goroutines.
func DialIdleH2(addr, local string) net.Conn {
	raw := DialFlood(addr, local)
	if raw == nil {
		return nil
	}
	// The attacker checks nothing and picks the cheapest key exchange.
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12, //nolint:gosec // see above
		CurvePreferences: []tls.CurveID{tls.X25519}})
	if err := c.Handshake(); err != nil {
		_ = raw.Close()
		return nil
	}
	if _, err := c.Write(http2Preface); err != nil {
		_ = c.Close()
		return nil
	}
	_ = raw.SetDeadline(time.Time{})
	return c
}

// FloodConn opens one connection from local to addr as kind says. It
// returns nil when the server refused it: closed it before the TLS
// handshake or the request's answer.
func FloodConn(tb testing.TB, addr, local string, kind FloodKind) net.Conn {
	tb.Helper()
	if kind == FloodH2 {
		return DialIdleH2(addr, local)
	}
	raw := DialFlood(addr, local)
	if raw == nil {
		return nil
	}
	if _, err := io.WriteString(raw, "GET /healthz HTTP/1.1\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		_ = raw.Close()
		return nil
	}
	resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil {
		_ = raw.Close()
		return nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	_ = raw.SetDeadline(time.Time{})
	return raw
}

// FloodKind is how a flood connection behaves once the server accepts it.
type FloodKind int

const (
	// FloodH2 completes TLS (ALPN h2), sends the HTTP/2 client preface
	// and an empty SETTINGS frame, and then nothing: issue 32's client.
	FloodH2 FloodKind = iota
	// FloodHTTP makes one plain HTTP/1.1 request (GET /healthz), reads
	// the answer and keeps the connection, idle.
	FloodHTTP
)

// http2Preface is the client connection preface (RFC 9113 §3.4) followed
// by an empty SETTINGS frame.
var http2Preface = append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)
