package trust

import (
	"crypto/tls"
	"crypto/x509"
)

// ServerTLSConfig returns a server configuration that requires an
// X509-SVID client certificate and verifies it with v. Verification runs in
// VerifyConnection, which crypto/tls calls on every handshake including
// resumed ones, against the store's snapshot of that moment: a root removed
// from the store stops being accepted on the next handshake, with no
// restart. Session tickets are off as well, so a resumption never stands in
// for a full handshake even if a caller swaps VerifyConnection out.
// getCert supplies the server's own certificate on every handshake, so it
// can rotate.
func ServerTLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), v *Verifier) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getCert,
		// The chain is verified by v against one trust domain's roots;
		// crypto/tls's own verification would need a single pool of all
		// of them, which is exactly the merge SPIFFE forbids.
		ClientAuth:             tls.RequireAnyClientCert,
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := v.verify(cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
			return err
		},
	}
}

// ClientTLSConfig returns a client configuration that verifies the
// server's X509-SVID with v (Web PKI host name checks do not apply to
// SPIFFE IDs; the Authorizer decides which server is acceptable).
// InsecureSkipVerify only turns off crypto/tls's built-in verification;
// VerifyConnection replaces it and runs on resumed sessions too.
// getClientCert supplies the client's own certificate on every handshake.
func ClientTLSConfig(getClientCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error), v *Verifier) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetClientCertificate: getClientCert,
		InsecureSkipVerify:   true, //nolint:gosec // verified in VerifyConnection against the peer's own trust domain.
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := v.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
			return err
		},
	}
}
