package authn

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
)

// Bounds on what a client may present, checked before any signature, so
// that the cost of verifying one unauthenticated chain is small and known.
//
// Go's chain builder tries every candidate parent whose subject matches an
// issuer, up to 100 signature checks per candidate (SPIFFE field note
// SPIRE #4415). A chain of CAs sharing one subject, signed with an
// RSA-8192 key and a huge public exponent, costs it ~74 expensive RSA
// verifications: ~150 ms of CPU per call, before the caller proved
// anything. With the bounds below, every presented subject is distinct
// (one candidate per step), every key is of a size real CAs use, and an
// RSA verification uses the exponent 65537, so a chain costs at most about
// maxPeerChain signature checks of at most 4096-bit keys.
const (
	// minRSABits and maxRSABits bound an RSA modulus. Below 2048 is
	// refused by every current CA policy; above 4096 costs several times
	// more per verification and nothing that issues SVIDs uses it.
	minRSABits = 2048
	maxRSABits = 4096
	// rsaExponent is the only RSA public exponent accepted. The cost of a
	// verification grows with the exponent's length; every CA library in
	// use (Go, OpenSSL, SPIRE, Istio, cert-manager, Vault) writes 65537,
	// and admitting small odd exponents such as 3 would only admit keys
	// nothing legitimate here produces.
	rsaExponent = 65537
)

// errChainBounds marks a chain refused by checkChainBounds.
var errChainBounds = errors.New("client certificate chain outside the accepted bounds")

// checkChainBounds refuses a chain that would cost more than an SVID chain
// to verify: a key of another type or size, an intermediate that is not a
// CA, or two certificates with the same subject. It checks no signature.
// certs has at most maxPeerChain elements, none nil.
func checkChainBounds(certs []*x509.Certificate) error {
	for i, c := range certs {
		if err := checkKey(c.PublicKey); err != nil {
			return fmt.Errorf("%w: certificate %d: %w", errChainBounds, i, err)
		}
		if i > 0 && (!c.BasicConstraintsValid || !c.IsCA) {
			return fmt.Errorf("%w: certificate %d is sent as an intermediate but is not a CA", errChainBounds, i)
		}
		for j := range i {
			if bytes.Equal(certs[j].RawSubject, c.RawSubject) {
				return fmt.Errorf("%w: certificates %d and %d have the same subject", errChainBounds, j, i)
			}
		}
	}
	return nil
}

// checkKey accepts the key types and sizes SVIDs are issued with: RSA
// 2048 to 4096 bits with exponent 65537, ECDSA on P-256, P-384 or P-521,
// and Ed25519.
func checkKey(pub any) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < minRSABits || n > maxRSABits {
			return fmt.Errorf("RSA key of %d bits, want %d to %d", n, minRSABits, maxRSABits)
		}
		if k.E != rsaExponent {
			return fmt.Errorf("RSA public exponent %d, want %d", k.E, rsaExponent)
		}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
		default:
			return errors.New("ECDSA key on a curve other than P-256, P-384 or P-521")
		}
	case ed25519.PublicKey:
	default:
		return fmt.Errorf("public key of type %T is not accepted", pub)
	}
	return nil
}
