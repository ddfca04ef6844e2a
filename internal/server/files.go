package server

import (
	"crypto/x509"
	"unicode/utf8"

	"github.com/trustbridge/trustbridge/internal/caclient"
)

// readPEMCerts reads the CERTIFICATE blocks of a file; there must be one.
func readPEMCerts(path string) ([]*x509.Certificate, error) {
	return caclient.ReadPEMCerts(path)
}

// parsePEMCerts parses every CERTIFICATE block; there must be one.
func parsePEMCerts(data []byte) ([]*x509.Certificate, error) {
	return caclient.ParsePEMCerts(data)
}

// readSmallFile reads at most limit bytes of a regular file.
func readSmallFile(path string, limit int64) ([]byte, error) {
	return caclient.ReadFile(path, limit)
}

// clipText cuts s to at most n bytes of whole UTF-8 characters, marked
// with an ellipsis when cut.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
