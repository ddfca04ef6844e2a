package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"strings"
)

// KeyType names the algorithm and size of a key the CA generates for
// itself. Workload keys are not generated here: they arrive in CSRs and are
// judged by checkPublicKey, which accepts a wider set.
type KeyType string

// Key types the CA can generate. The values are what operators write in
// configuration, so they are stable.
const (
	KeyECP256  KeyType = "ec-p256"
	KeyECP384  KeyType = "ec-p384"
	KeyRSA2048 KeyType = "rsa-2048"
	KeyRSA3072 KeyType = "rsa-3072"
	KeyRSA4096 KeyType = "rsa-4096"
)

// keyTypes lists the valid key types in the order error messages show them.
// A function rather than a variable so that nobody can append to it.
func keyTypes() []KeyType {
	return []KeyType{KeyECP256, KeyECP384, KeyRSA2048, KeyRSA3072, KeyRSA4096}
}

func validKeyTypes() string {
	names := make([]string, 0, 5)
	for _, kt := range keyTypes() {
		names = append(names, string(kt))
	}
	return strings.Join(names, ", ")
}

// ParseKeyType parses a configured key type. Matching is exact: the values
// are lowercase identifiers, and accepting variants would make two spellings
// of one setting appear in configs and diffs.
func ParseKeyType(s string) (KeyType, error) {
	for _, kt := range keyTypes() {
		if s == string(kt) {
			return kt, nil
		}
	}
	return "", fmt.Errorf("ca: unknown key type %q (valid: %s)", s, validKeyTypes())
}

// GenerateKey returns a new private key of type kt from crypto/rand.
func GenerateKey(kt KeyType) (crypto.Signer, error) {
	var (
		key crypto.Signer
		err error
	)
	switch kt {
	case KeyECP256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyECP384:
		key, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case KeyRSA2048:
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	case KeyRSA3072:
		key, err = rsa.GenerateKey(rand.Reader, 3072)
	case KeyRSA4096:
		key, err = rsa.GenerateKey(rand.Reader, 4096)
	default:
		return nil, fmt.Errorf("ca: unknown key type %q (valid: %s)", kt, validKeyTypes())
	}
	if err != nil {
		return nil, fmt.Errorf("ca: generate %s key: %w", kt, err)
	}
	return key, nil
}

// RSA bounds for keys in CSRs. The floor is NIST SP 800-57's 112-bit
// security level; the ceiling keeps a hostile CSR from making us (and every
// peer that verifies the leaf) do arbitrarily expensive RSA operations.
const (
	minRSABits = 2048
	maxRSABits = 8192
)

// checkPublicKey decides whether a workload key is strong enough to be
// certified. It names the key in its error but does not wrap a sentinel:
// callers add the one that fits (ErrInvalidCSR).
func checkPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return checkECDSAKey(k)
	case *rsa.PublicKey:
		return checkRSAKey(k)
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("ed25519 key of %d bytes not allowed (want %d)", len(k), ed25519.PublicKeySize)
		}
		return nil
	default:
		return fmt.Errorf("key type %T not allowed (want ECDSA, RSA or Ed25519)", pub)
	}
}

// checkECDSAKey allows the NIST curves P-256, P-384 and P-521.
func checkECDSAKey(k *ecdsa.PublicKey) error {
	if k == nil || k.Curve == nil {
		return errors.New("empty ecdsa key")
	}
	// Identity comparison on purpose: the standard curves are
	// singletons, and a look-alike CurveParams must not pass by name.
	switch k.Curve {
	case elliptic.P256(), elliptic.P384(), elliptic.P521():
		return nil
	}
	name := "unknown"
	if params := k.Curve.Params(); params != nil && params.Name != "" {
		name = params.Name
	}
	return fmt.Errorf("ecdsa curve %s not allowed (want P-256, P-384 or P-521)", name)
}

// checkRSAKey allows minRSABits to maxRSABits with an odd exponent of at
// least 3.
func checkRSAKey(k *rsa.PublicKey) error {
	if k == nil || k.N == nil {
		return errors.New("empty rsa key")
	}
	if bits := k.N.BitLen(); bits < minRSABits || bits > maxRSABits {
		return fmt.Errorf("rsa key of %d bits not allowed (want %d to %d)", bits, minRSABits, maxRSABits)
	}
	// An even or tiny exponent is either broken or crafted; no honest
	// key generator produces one.
	if k.E < 3 || k.E%2 == 0 {
		return fmt.Errorf("rsa public exponent %d not allowed (want odd, at least 3)", k.E)
	}
	return nil
}
