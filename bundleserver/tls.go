package bundleserver

import (
	"crypto/tls"
	"slices"
)

// cipherSuites are Mozilla's "intermediate" TLS 1.2 suites that Go
// implements: ECDHE key exchange with AEAD ciphers only. TLS 1.3 suites
// are not configurable and all fine.
var cipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// curves keeps Go's default hybrid post-quantum key exchange first
// (listing curves explicitly would otherwise drop it), then the classic
// curves of Mozilla's intermediate profile.
var curves = []tls.CurveID{tls.X25519MLKEM768, tls.X25519, tls.CurveP256, tls.CurveP384}

// TLSConfig returns a new copy of the server's TLS configuration: TLS 1.2
// or later, the intermediate suites and curves, the certificate from
// Config.GetCertificate, and no client authentication, which the
// Federation spec (§5) says a bundle endpoint must not require. Session
// tickets stay on: peers verify the server, and the server verifies no
// one, so resumption skips nothing here.
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS12,
		CipherSuites:     slices.Clone(cipherSuites),
		CurvePreferences: slices.Clone(curves),
		ClientAuth:       tls.NoClientCert,
		GetCertificate:   s.cfg.GetCertificate,
		NextProtos:       s.nextProtos(),
	}
}

func (s *Server) nextProtos() []string {
	protos := []string{"h2", "http/1.1"}
	for _, p := range s.cfg.NextProtos {
		if !slices.Contains(protos, p) {
			protos = append(protos, p)
		}
	}
	return protos
}
