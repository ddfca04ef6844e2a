package testca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// KeyType names a key algorithm and size.
type KeyType string

// Key types the helpers can mint.
const (
	ECP256   KeyType = "ec-p256"
	ECP384   KeyType = "ec-p384"
	ECP521   KeyType = "ec-p521"
	Ed25519  KeyType = "ed25519"
	RSA1024  KeyType = "rsa-1024"
	RSA2048  KeyType = "rsa-2048"
	RSA4096  KeyType = "rsa-4096"
	RSA8192  KeyType = "rsa-8192"
	RSA16384 KeyType = "rsa-16384"
)

// rsaCache keeps one RSA key per size for the life of the test binary:
// generating them dominates test time otherwise, and tests only need a key
// of the right shape, not a unique one.
var rsaCache sync.Map

// NewKey returns a private key of the given type. RSA keys are cached per
// size; ECDSA and Ed25519 keys are fresh.
func NewKey(tb testing.TB, kt KeyType) crypto.Signer {
	tb.Helper()
	var (
		k   crypto.Signer
		err error
	)
	switch kt {
	case ECP256:
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ECP384:
		k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case ECP521:
		k, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case Ed25519:
		_, k, err = ed25519.GenerateKey(rand.Reader)
	case RSA1024, RSA2048, RSA4096, RSA8192, RSA16384:
		bits := map[KeyType]int{RSA1024: 1024, RSA2048: 2048, RSA4096: 4096, RSA8192: 8192, RSA16384: 16384}[kt]
		if cached, ok := rsaCache.Load(bits); ok {
			return cached.(crypto.Signer)
		}
		k, err = rsaKey(bits)
		if err == nil {
			actual, _ := rsaCache.LoadOrStore(bits, k)
			k = actual.(crypto.Signer)
		}
	default:
		tb.Fatalf("testca: unknown key type %q", kt)
	}
	if err != nil {
		tb.Fatalf("testca: generate %s key: %v", kt, err)
	}
	return k
}

// rsaKey generates an RSA key. Go refuses keys under 1024 bits unless told
// otherwise; tests never need those.
func rsaKey(bits int) (*rsa.PrivateKey, error) {
	return rsa.GenerateKey(rand.Reader, bits)
}

// CA is a self-signed SPIFFE CA for one trust domain.
type CA struct {
	TrustDomain spiffeid.TrustDomain
	Cert        *x509.Certificate
	Key         crypto.Signer
}

// Options adjusts the certificate a CA or leaf is minted with.
type Options struct {
	KeyType   KeyType       // default ECP256
	Key       crypto.Signer // overrides KeyType
	NotBefore time.Time     // default now - 1m
	NotAfter  time.Time     // default NotBefore + 24h
	// Mutate, when set, edits the template before signing.
	Mutate func(*x509.Certificate)
}

var serial struct {
	sync.Mutex
	n int64
}

func nextSerial() *big.Int {
	serial.Lock()
	defer serial.Unlock()
	serial.n++
	// Random high bits keep serials unique across test binaries too.
	r, _ := rand.Int(rand.Reader, big.NewInt(1<<40))
	return new(big.Int).Add(new(big.Int).Lsh(r, 20), big.NewInt(serial.n))
}

func (o Options) key(tb testing.TB) crypto.Signer {
	tb.Helper()
	if o.Key != nil {
		return o.Key
	}
	if o.KeyType == "" {
		return NewKey(tb, ECP256)
	}
	return NewKey(tb, o.KeyType)
}

func (o Options) validity() (time.Time, time.Time) {
	nb := o.NotBefore
	if nb.IsZero() {
		nb = time.Now().Add(-time.Minute).Truncate(time.Second)
	}
	na := o.NotAfter
	if na.IsZero() {
		na = nb.Add(24 * time.Hour)
	}
	return nb, na
}

// New mints a self-signed root CA for td with a SPIFFE ID URI SAN
// spiffe://td and a unique subject.
func New(tb testing.TB, td string, opts ...Options) *CA {
	tb.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	trustDomain := spiffeid.RequireTrustDomainFromString(td)
	key := o.key(tb)
	nb, na := o.validity()
	sn := nextSerial()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{Organization: []string{td}, SerialNumber: sn.String()},
		NotBefore:             nb,
		NotAfter:              na,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{trustDomain.ID().URL()},
	}
	if o.Mutate != nil {
		o.Mutate(tmpl)
	}
	cert := Sign(tb, tmpl, tmpl, key.Public(), key)
	return &CA{TrustDomain: trustDomain, Cert: cert, Key: key}
}

// Bundle returns a bundle holding just this CA's certificate.
func (ca *CA) Bundle() *spiffebundle.Bundle {
	return spiffebundle.FromX509Authorities(ca.TrustDomain, []*x509.Certificate{ca.Cert})
}

// Issue mints an X509-SVID leaf for id signed by the CA.
func (ca *CA) Issue(tb testing.TB, id spiffeid.ID, opts ...Options) (*x509.Certificate, crypto.Signer) {
	tb.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	key := o.key(tb)
	nb, na := o.validity()
	if na.After(ca.Cert.NotAfter) {
		na = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		NotBefore:             nb,
		NotAfter:              na,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:                  []*url.URL{id.URL()},
	}
	if o.Mutate != nil {
		o.Mutate(tmpl)
	}
	return Sign(tb, tmpl, ca.Cert, key.Public(), ca.Key), key
}

// Sign signs tmpl with parent's key and returns the parsed certificate.
func Sign(tb testing.TB, tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) *x509.Certificate {
	tb.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		tb.Fatalf("testca: create certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("testca: parse certificate: %v", err)
	}
	return cert
}
