package cli

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/fileutil"
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

// OutFile is one file a command writes into a directory: an SVID's
// chain, key or bundle (x509 mint --write, agent api fetch x509 --write).
type OutFile struct {
	Name string
	Data []byte
	Mode os.FileMode
}

// WriteFiles writes files into dir, created mode 0700 when missing, each
// atomically (a reader sees the old file or the new, never half a key)
// and with its mode, whatever the umask.
func WriteFiles(dir string, files []OutFile) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if err := fileutil.Write(filepath.Join(dir, f.Name), f.Data, f.Mode); err != nil {
			return fmt.Errorf("write %s: %w", filepath.Join(dir, f.Name), err)
		}
	}
	return nil
}

// KeyPEM is key as a PKCS#8 PRIVATE KEY block, as SPIRE and Istio write
// it.
func KeyPEM(key crypto.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
