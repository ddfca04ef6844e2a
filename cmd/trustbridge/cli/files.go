package cli

import (
	"crypto/x509"
	"encoding/pem"

	"github.com/trustbridge/trustbridge/internal/caclient"
)

func ReadPEMCerts(path string) ([]*x509.Certificate, error) {
	return caclient.ReadPEMCerts(path)
}

// ParsePEMCerts parses every CERTIFICATE block; there must be one.
func ParsePEMCerts(data []byte) ([]*x509.Certificate, error) {
	return caclient.ParsePEMCerts(data)
}

// ReadSmallFile reads at most limit bytes of a regular file.
func ReadSmallFile(path string, limit int64) ([]byte, error) {
	return caclient.ReadFile(path, limit)
}

func CertsPEM(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}
