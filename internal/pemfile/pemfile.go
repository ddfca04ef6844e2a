package pemfile

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

const (
	// MaxSize bounds the input of every parser: larger than any key or
	// certificate list trustbridge uses, and what its file readers cap.
	MaxSize = 1 << 20
	// MaxCertificates bounds the certificates of one input.
	MaxCertificates = 1000
)

const certificateType = "CERTIFICATE"

// ParseCertificates parses data made of CERTIFICATE blocks only, at least
// one, separated by nothing but whitespace. Errors number blocks and
// certificates from 1.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	blocks, err := splitBlocks(data)
	if err != nil {
		return nil, err
	}
	switch {
	case len(data) == 0:
		return nil, errors.New(`no PEM certificate: the input is empty; want one or more "-----BEGIN CERTIFICATE-----" blocks`)
	case len(blocks) == 0:
		return nil, errors.New(`no PEM block, only whitespace; want one or more "-----BEGIN CERTIFICATE-----" blocks`)
	}
	certs := make([]*x509.Certificate, 0, len(blocks))
	for i, b := range blocks {
		if b.Type != certificateType {
			return nil, fmt.Errorf("block %d: unexpected PEM block %q, want CERTIFICATE (a %q is not a CERTIFICATE; keep it in a file of its own)", i+1, b.Type, b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", i+1, err)
		}
		certs = append(certs, c)
	}
	return certs, nil
}

// ParsePrivateKey parses data made of one unencrypted private key block:
// PKCS #8 ("PRIVATE KEY"), SEC 1 ("EC PRIVATE KEY") or PKCS #1 ("RSA
// PRIVATE KEY"), the forms Go, openssl and Istio's tools write.
func ParsePrivateKey(data []byte) (crypto.Signer, error) {
	blocks, err := splitBlocks(data)
	if err != nil {
		return nil, err
	}
	if len(blocks) == 0 {
		return nil, errors.New("no PEM block; want one \"-----BEGIN PRIVATE KEY-----\" (or EC/RSA PRIVATE KEY) block")
	}
	if len(blocks) != 1 {
		return nil, fmt.Errorf("holds %d PEM blocks, want exactly 1 private key (more than one makes the key ambiguous)", len(blocks))
	}
	return parseKeyBlock(blocks[0])
}

func parseKeyBlock(b *pem.Block) (crypto.Signer, error) {
	var (
		key any
		err error
	)
	switch b.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("unexpected PEM block %q: not a private key in a form trustbridge reads; want PRIVATE KEY (PKCS #8), EC PRIVATE KEY or RSA PRIVATE KEY, unencrypted", b.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%s block: %w", b.Type, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%T keys cannot sign; want an ECDSA, RSA or Ed25519 key", key)
	}
	return signer, nil
}

// FindCertificates parses every CERTIFICATE block of data, skipping text
// and blocks of other types around them, as in CA bundles that name each
// root in a comment line. There must be one. Errors number certificates
// from 0, as the CA client has always reported them.
func FindCertificates(data []byte) ([]*x509.Certificate, error) {
	if len(data) > MaxSize {
		return nil, tooLarge(data)
	}
	var certs []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != certificateType {
			continue
		}
		if len(certs) == MaxCertificates {
			return nil, fmt.Errorf("more than %d certificates", MaxCertificates)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs), err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificates")
	}
	return certs, nil
}

var beginLine = []byte("-----BEGIN ")

// splitBlocks splits data into PEM blocks and refuses anything else but
// whitespace. It returns no blocks for empty data.
func splitBlocks(data []byte) ([]*pem.Block, error) {
	if len(data) > MaxSize {
		return nil, tooLarge(data)
	}
	var blocks []*pem.Block
	for rest := data; ; {
		trimmed := bytes.TrimLeft(rest, " \t\r\n")
		if len(trimmed) == 0 {
			return blocks, nil
		}
		// Counting BEGIN lines stops pem.Decode from skipping a malformed
		// block and returning the one after it.
		block, next := pem.Decode(trimmed)
		consumed := trimmed[:len(trimmed)-len(next)]
		if block == nil || !bytes.HasPrefix(trimmed, beginLine) || bytes.Count(consumed, beginLine) != 1 {
			return nil, fmt.Errorf("unexpected data at byte %d: not PEM; want only PEM blocks (\"-----BEGIN ...\" to \"-----END ...\") and whitespace", len(data)-len(trimmed))
		}
		// Proc-Type/DEK-Info headers mean a legacy encrypted key, which
		// cannot be used without its passphrase.
		if len(block.Headers) > 0 {
			return nil, fmt.Errorf("block %d: PEM headers are not supported (encrypted key? decrypt it first, e.g. openssl pkey -in key.pem -out plain.pem)", len(blocks)+1)
		}
		if len(blocks) == MaxCertificates {
			return nil, fmt.Errorf("more than %d PEM blocks; at most %d certificates are accepted", MaxCertificates, MaxCertificates)
		}
		blocks = append(blocks, block)
		rest = next
	}
}

func tooLarge(data []byte) error {
	return fmt.Errorf("%d bytes of PEM; at most %d are accepted", len(data), MaxSize)
}
