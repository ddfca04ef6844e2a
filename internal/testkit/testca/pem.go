package testca

import (
	"crypto/x509"
	"encoding/pem"
)

// PEM is certs as concatenated PEM CERTIFICATE blocks, as a root-cert.pem
// or `spire-server bundle show -format pem` holds them.
func PEM(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}
