package attest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/credentials"
)

// recordTypeHandshake is the first byte of every TLS connection: the
// content type of the record carrying the ClientHello. An HTTP/2 client
// in plaintext starts with its preface, "PRI * HTTP/2.0", instead.
const recordTypeHandshake = 0x16

// authTypeTLS is what Caller.AuthType reports for a caller that also
// presented an X509-SVID.
const authTypeTLS = "peercred+tls"

// CredentialsWithTLS is Credentials for a unix socket that serves mutual
// TLS and plaintext on one socket: the Broker Endpoint specification's
// brokers connect with mTLS, SPIRE's Delegated Identity API clients in
// plaintext. Every caller is read from the socket first, as Credentials
// reads it; then a connection whose first byte opens a TLS handshake
// record is handshaken with the tls.Config config returns (called for
// each such connection, so a rotated certificate or bundle applies to the
// next one), and any other is served in plaintext.
//
// The config decides which client certificates it accepts, and must
// demand and verify one: ClientAuth RequireAndVerifyClientCert, or
// RequireAnyClientCert with a VerifyPeerCertificate or VerifyConnection
// hook (go-spiffe's tlsconfig.MTLSServerConfig); a config that does not is
// an error, and so is a client that presents no certificate or one that
// is not an X509-SVID. The verified leaf's SPIFFE ID is the Caller's
// SVID. "h2" is added to the config's NextProtos: gRPC clients require
// it negotiated.
//
// The gRPC server's connection timeout (grpc.ConnectionTimeout, 120
// seconds by default) bounds the wait for the first byte and the TLS
// handshake.
func (a *Attestor) CredentialsWithTLS(config func() (*tls.Config, error)) credentials.TransportCredentials {
	return &peerCredentials{procRoot: a.cfg.ProcRoot, binary: a.cfg.Binary, tlsConfig: config}
}

// upgrade serves cc in TLS when its caller opens with a TLS handshake, or
// else returns cc as is with the byte it read to tell put back.
func (p *peerCredentials) upgrade(cc *callerConn) error {
	var first [1]byte
	if _, err := io.ReadFull(cc.Conn, first[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return io.EOF // gRPC takes a prober's close quietly
		}
		return fmt.Errorf("attest: reading the caller's first byte: %w", err)
	}
	head := &headConn{Conn: cc.Conn, head: first[:]}
	cc.Conn = head
	if first[0] != recordTypeHandshake {
		return nil
	}
	cfg, err := p.serverTLS()
	if err != nil {
		return err
	}
	tc := tls.Server(head, cfg)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("attest: TLS handshake with pid %d: %w", cc.caller.PID, err)
	}
	cc.Conn = tc
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return fmt.Errorf("attest: TLS handshake with pid %d: it presented no certificate", cc.caller.PID)
	}
	id, err := x509svid.IDFromCert(certs[0])
	if err != nil {
		return fmt.Errorf("attest: TLS handshake with pid %d: its certificate is not an X509-SVID: %w", cc.caller.PID, err)
	}
	cc.caller.SVID = id
	return nil
}

// serverTLS is the config to handshake with, checked to verify clients.
func (p *peerCredentials) serverTLS() (*tls.Config, error) {
	cfg, err := p.tlsConfig()
	if err != nil {
		return nil, fmt.Errorf("attest: the TLS config: %w", err)
	}
	if cfg == nil {
		return nil, errors.New("attest: no TLS config")
	}
	hooked := cfg.VerifyPeerCertificate != nil || cfg.VerifyConnection != nil
	switch {
	case cfg.GetConfigForClient != nil:
		// Its config would escape the check below.
		return nil, errors.New("attest: the TLS config has GetConfigForClient: return the config from the function given to CredentialsWithTLS instead")
	case cfg.ClientAuth == tls.RequireAndVerifyClientCert:
	case cfg.ClientAuth == tls.RequireAnyClientCert && hooked:
	default:
		return nil, fmt.Errorf("attest: the TLS config does not verify client certificates (ClientAuth %s): want RequireAndVerifyClientCert, or RequireAnyClientCert with a verification hook", cfg.ClientAuth)
	}
	cfg = cfg.Clone()
	// A resumed session skips the verification hook: every connection
	// verifies its certificate against the roots of now.
	cfg.SessionTicketsDisabled = true
	if !slices.Contains(cfg.NextProtos, "h2") {
		cfg.NextProtos = append(slices.Clone(cfg.NextProtos), "h2")
	}
	return cfg, nil
}

// headConn reads head again before the rest of the connection: the byte
// read to tell TLS from plaintext.
type headConn struct {
	net.Conn
	head []byte
}

func (c *headConn) Read(b []byte) (int, error) {
	if len(c.head) == 0 {
		return c.Conn.Read(b)
	}
	n := copy(b, c.head)
	c.head = c.head[n:]
	return n, nil
}
