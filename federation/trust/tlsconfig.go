package trust

import (
	"crypto/tls"
	"crypto/x509"
)

// ClientTLSConfig returns a client configuration that verifies the
// server's X509-SVID with v (Web PKI host name checks do not apply to
// SPIFFE IDs; the Authorizer decides which server is acceptable).
// InsecureSkipVerify only turns off crypto/tls's built-in verification;
// VerifyConnection replaces it and runs on every handshake, resumed ones
// included, against v.Bundles as they are at that moment: a root removed
// from a Store stops being accepted on the next handshake. crypto/tls's
// own verification would need one pool of every trust domain's roots,
// which is exactly the merge SPIFFE forbids. There is no session cache,
// so every handshake is a full one. getClientCert supplies the client's
// own certificate on every handshake, so it can rotate; nil sends none.
func ClientTLSConfig(getClientCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error), v *Verifier) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetClientCertificate: getClientCert,
		InsecureSkipVerify:   true, //nolint:gosec // verified in VerifyConnection against the peer's own trust domain.
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := v.VerifyCertificates(cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
			return err
		},
	}
}
