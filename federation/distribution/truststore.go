package distribution

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	pkcs12 "software.sslmate.com/src/go-pkcs12"
)

// KeyTruststore holds the local trust domain's X.509 roots as a PKCS#12
// truststore, for Java (binaryData of a ConfigMap, data of a Secret). It
// holds the local roots only: a truststore has no notion of trust domain,
// so federated roots in it would let a peer's CA vouch for local names.
const KeyTruststore = "truststore.p12"

// Truststore profiles, as trust-manager names them: the PKCS#12
// algorithms used when the truststore has a password. Without one it is
// written unencrypted and without a MAC (go-pkcs12's Passwordless), the
// only form keytool opens under the empty password.
const (
	ProfileModern2023 = "Modern2023"
	ProfileLegacyDES  = "LegacyDES"
	ProfileLegacyRC2  = "LegacyRC2"
)

// Truststore configures the PKCS#12 truststore key; the zero value
// writes none.
type Truststore struct {
	// Enabled adds KeyTruststore.
	Enabled bool
	// Password seals it; "" writes a passwordless truststore (what
	// trust-manager writes without a password).
	Password string
	// Profile picks the algorithms for a password (default
	// ProfileLegacyRC2, trust-manager's default, which every Java reads;
	// ProfileModern2023 needs Java 8u301/11.0.12 or later).
	Profile string
}

func (t Truststore) encoder() (*pkcs12.Encoder, error) {
	if t.Password == "" {
		return pkcs12.Passwordless, nil
	}
	switch t.Profile {
	case "", ProfileLegacyRC2:
		return pkcs12.LegacyRC2, nil
	case ProfileLegacyDES:
		return pkcs12.LegacyDES, nil
	case ProfileModern2023:
		return pkcs12.Modern2023, nil
	default:
		return nil, fmt.Errorf("truststore profile %q: want %s, %s or %s", t.Profile, ProfileLegacyRC2, ProfileLegacyDES, ProfileModern2023)
	}
}

// encodeTruststore writes the local bundle's X.509 roots as a truststore.
// The encoding draws fresh salts, so the bytes differ on every call:
// compare truststores with truststoreHolds, not by bytes.
func encodeTruststore(enc *pkcs12.Encoder, b *spiffebundle.Bundle, password string) ([]byte, []*x509.Certificate, error) {
	roots := b.X509Authorities()
	entries := make([]pkcs12.TrustStoreEntry, len(roots))
	for i, c := range roots {
		// Distinct aliases: entries sharing one would merge in the JVM.
		entries[i] = pkcs12.TrustStoreEntry{Cert: c, FriendlyName: fmt.Sprintf("%s-%d", b.TrustDomain().Name(), i)}
	}
	p12, err := enc.EncodeTrustStoreEntries(entries, password)
	if err != nil {
		return nil, nil, fmt.Errorf("encode %s: %w", KeyTruststore, err)
	}
	return p12, roots, nil
}

// truststoreHolds reports whether p12 opens with password and holds
// exactly roots, in order.
func truststoreHolds(p12 []byte, password string, roots []*x509.Certificate) bool {
	certs, err := pkcs12.DecodeTrustStore(p12, password)
	if err != nil {
		return false
	}
	return slices.EqualFunc(certs, roots, func(a, b *x509.Certificate) bool { return bytes.Equal(a.Raw, b.Raw) })
}
