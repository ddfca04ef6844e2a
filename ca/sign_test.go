package ca_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// Tests run at a fixed instant; nothing here depends on the wall clock
// (openssl is told the time with -attime).
var (
	signNow    = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	signTD     = spiffeid.RequireTrustDomainFromString("example.org")
	workloadID = spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web")
	signPolicy = ca.Policy{TrustDomain: signTD}
)

// newSignRoot mints a self-signed root valid from a day before signNow for
// the given span after it.
func newSignRoot(tb testing.TB, life time.Duration, kt testca.KeyType) *testca.CA {
	tb.Helper()
	return testca.New(tb, signTD.Name(), testca.Options{
		KeyType:   kt,
		NotBefore: signNow.Add(-24 * time.Hour),
		NotAfter:  signNow.Add(life),
	})
}

func rootMaterial(root *testca.CA) ca.SigningMaterial {
	return ca.SigningMaterial{Cert: root.Cert, Key: root.Key, Roots: []*x509.Certificate{root.Cert}}
}

// newSubCA mints a CA certificate under parent, the shape of a plugged-in
// intermediate. mutate, when set, edits the template.
func newSubCA(tb testing.TB, parent *x509.Certificate, parentKey crypto.Signer, nb, na time.Time, mutate func(*x509.Certificate)) (*x509.Certificate, crypto.Signer) {
	tb.Helper()
	key := testca.NewKey(tb, testca.ECP256)
	sn, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "intermediate", SerialNumber: sn.String()},
		NotBefore:             nb,
		NotAfter:              na,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{signTD.ID().URL()},
	}
	if mutate != nil {
		mutate(tmpl)
	}
	return testca.Sign(tb, tmpl, parent, key.Public(), parentKey), key
}

// newCSR returns a DER CSR for key; tmpl may be nil.
func newCSR(tb testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	tb.Helper()
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(tb, err)
	return der
}

func csrPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func uris(ss ...string) []*url.URL {
	out := make([]*url.URL, 0, len(ss))
	for _, s := range ss {
		u, err := url.Parse(s)
		if err != nil {
			panic(err)
		}
		out = append(out, u)
	}
	return out
}

// parsedCSR runs a CSR through ParseCSR, for tests about Sign.
func parsedCSR(tb testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) *x509.CertificateRequest {
	tb.Helper()
	csr, err := ca.ParseCSR(newCSR(tb, key, tmpl))
	require.NoError(tb, err)
	return csr
}

// verifySVID checks the issued chain the way a go-spiffe peer would.
func verifySVID(tb testing.TB, issued *ca.Issued, roots []*x509.Certificate) {
	tb.Helper()
	raw := make([][]byte, 0, len(issued.Chain))
	for _, c := range issued.Chain {
		raw = append(raw, c.Raw)
	}
	got, _, err := x509svid.ParseAndVerify(raw, x509bundle.FromX509Authorities(signTD, roots), x509svid.WithTime(signNow))
	require.NoError(tb, err)
	assert.Equal(tb, workloadID, got)
}

// padTo appends whitespace, which ParseCSR otherwise tolerates, until data
// is n bytes long.
func padTo(data []byte, n int) []byte {
	return append(bytes.Clone(data), bytes.Repeat([]byte("\n"), n-len(data))...)
}

func TestParseCSRAccepts(t *testing.T) {
	ecDER := newCSR(t, testca.NewKey(t, testca.ECP256), nil)
	tests := []struct {
		name string
		in   []byte
	}{
		{"pem ec-p256", csrPEM(ecDER)},
		{"der ec-p256", ecDER},
		{"pem ec-p384", csrPEM(newCSR(t, testca.NewKey(t, testca.ECP384), nil))},
		{"pem ec-p521", csrPEM(newCSR(t, testca.NewKey(t, testca.ECP521), nil))},
		{"pem rsa-2048", csrPEM(newCSR(t, testca.NewKey(t, testca.RSA2048), nil))},
		{"der rsa-4096", newCSR(t, testca.NewKey(t, testca.RSA4096), nil)},
		{"pem ed25519", csrPEM(newCSR(t, testca.NewKey(t, testca.Ed25519), nil))},
		{"legacy NEW CERTIFICATE REQUEST type", pem.EncodeToMemory(&pem.Block{Type: "NEW CERTIFICATE REQUEST", Bytes: ecDER})},
		{"surrounding whitespace", append(append([]byte(" \r\n\t"), csrPEM(ecDER)...), "\r\n\n  "...)},
		{"exactly MaxCSRSize", padTo(csrPEM(ecDER), ca.MaxCSRSize)},
		{"with URI SAN", csrPEM(newCSR(t, testca.NewKey(t, testca.ECP256), &x509.CertificateRequest{URIs: uris(workloadID.String())}))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csr, err := ca.ParseCSR(tt.in)
			require.NoError(t, err)
			assert.NoError(t, csr.CheckSignature())
		})
	}
}

func TestParseCSRRefuses(t *testing.T) {
	key := testca.NewKey(t, testca.ECP256)
	der := newCSR(t, key, nil)
	good := csrPEM(der)
	root := newSignRoot(t, 24*time.Hour, testca.ECP256)

	badSig := bytes.Clone(der)
	badSig[len(badSig)-1] ^= 0x01 // inside the signature BIT STRING
	rsaDER := newCSR(t, testca.NewKey(t, testca.RSA2048), nil)
	rsaBadSig := bytes.Clone(rsaDER)
	rsaBadSig[len(rsaBadSig)-1] ^= 0x01
	// A CSR whose TBS was altered after signing: signature checks the TBS.
	otherSubject := newCSR(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "aaaa"}})
	tampered := bytes.Replace(bytes.Clone(otherSubject), []byte("aaaa"), []byte("bbbb"), 1)

	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)

	withHeaders := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: der})
	badFirstBlock := append([]byte("-----BEGIN CERTIFICATE REQUEST-----\n!!!!\n-----END CERTIFICATE REQUEST-----\n"), good...)

	tests := []struct {
		name string
		in   []byte
		want string // in the message
	}{
		{"nil", nil, "empty input"},
		{"whitespace only", []byte(" \n\t\r\n"), "empty input"},
		{"over MaxCSRSize", padTo(good, ca.MaxCSRSize+1), "exceeds the limit of 65536"},
		{"two PEM blocks", append(bytes.Clone(good), good...), "2 PEM blocks"},
		{"CSR then certificate", append(bytes.Clone(good), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw})...), "2 PEM blocks"},
		{"malformed block before a good one", badFirstBlock, "2 PEM blocks"},
		{"certificate block", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw}), `type "CERTIFICATE"`},
		{"private key block", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), `type "PRIVATE KEY"`},
		{"PEM headers", withHeaders, "headers"},
		{"leading garbage", append([]byte("hello\n"), good...), "bytes after the first value"},
		{"trailing garbage", append(bytes.Clone(good), "junk"...), "trailing data"},
		{"truncated PEM", good[:len(good)-30], "malformed PEM"},
		{"DER with trailing byte", append(bytes.Clone(der), 0), "not PEM, and as DER: 1 bytes after the first value"},
		{"DER with trailing newline", append(bytes.Clone(der), '\n'), "not PEM, and as DER: 1 bytes after the first value"},
		{"truncated DER", der[:len(der)-1], "not PEM, and not DER"},
		{"DER of a certificate", root.Cert.Raw, "asn1"},
		{"garbage", []byte("not a csr"), "not PEM, and not DER"},
		{"bad EC signature", badSig, "signature"},
		{"bad RSA signature", csrPEM(rsaBadSig), "signature"},
		{"tampered TBS", tampered, "signature"},
		{"ec-p224 key", csrPEM(newCSR(t, p224, nil)), "curve P-224 not allowed"},
		{"rsa-1024 key", csrPEM(newCSR(t, testca.NewKey(t, testca.RSA1024), nil)), "rsa key of 1024 bits not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csr, err := ca.ParseCSR(tt.in)
			require.Error(t, err)
			assert.Nil(t, csr)
			assert.ErrorIs(t, err, ca.ErrInvalidCSR)
			assert.True(t, strings.HasPrefix(err.Error(), "ca: invalid CSR: "), err.Error())
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestSignLeaf(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	key := testca.NewKey(t, testca.ECP256)
	csr := parsedCSR(t, key, nil)

	issued, err := ca.Sign(signNow, rootMaterial(root), signPolicy, csr, workloadID, time.Hour)
	require.NoError(t, err)
	leaf := issued.Leaf

	assert.Equal(t, 3, leaf.Version)
	assert.False(t, leaf.IsCA)
	assert.True(t, leaf.BasicConstraintsValid)
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, workloadID.String(), leaf.URIs[0].String())
	assert.Empty(t, leaf.DNSNames)
	assert.Empty(t, leaf.IPAddresses)
	assert.Empty(t, leaf.EmailAddresses)
	assert.Equal(t, []byte{0x30, 0x00}, leaf.RawSubject, "subject must be empty")
	assert.Equal(t, x509.KeyUsageDigitalSignature, leaf.KeyUsage)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage)
	assert.Equal(t, signNow.Add(-10*time.Second), leaf.NotBefore)
	assert.Equal(t, signNow.Add(time.Hour), leaf.NotAfter)
	assert.Empty(t, leaf.CRLDistributionPoints)
	assert.Empty(t, leaf.OCSPServer)
	assert.Empty(t, leaf.IssuingCertificateURL)
	assert.True(t, key.Public().(*ecdsa.PublicKey).Equal(leaf.PublicKey))
	assert.Equal(t, root.Cert.RawSubject, leaf.RawIssuer)

	// RFC 5280 §4.2.1.6: with an empty subject the SAN extension is critical.
	var san *pkix.Extension
	for i, ext := range leaf.Extensions {
		if ext.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) {
			san = &leaf.Extensions[i]
		}
	}
	require.NotNil(t, san, "no SAN extension")
	assert.True(t, san.Critical, "SAN extension must be critical")

	// Serial: positive, 128 random bits at most, at most 20 octets.
	assert.Positive(t, leaf.SerialNumber.Sign())
	assert.LessOrEqual(t, leaf.SerialNumber.BitLen(), 128)
	assert.LessOrEqual(t, len(leaf.SerialNumber.Bytes()), 20)

	// AuthorityKeyId: the CA's SubjectKeyId.
	assertSKID(t, leaf)
	require.NotEmpty(t, root.Cert.SubjectKeyId)
	assert.Equal(t, root.Cert.SubjectKeyId, leaf.AuthorityKeyId)

	// The signing certificate is the root, so it appears once, as a root.
	assert.Equal(t, []*x509.Certificate{leaf, root.Cert}, issued.Chain)
	assert.Equal(t, []*x509.Certificate{root.Cert}, issued.Roots)
	verifySVID(t, issued, []*x509.Certificate{root.Cert})
}

// assertSKID checks the leaf's SubjectKeyId against RFC 7093 §2 method 1,
// computed from the certificate as encoded.
func assertSKID(tb testing.TB, leaf *x509.Certificate) {
	tb.Helper()
	var spki struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	_, err := asn1.Unmarshal(leaf.RawSubjectPublicKeyInfo, &spki)
	require.NoError(tb, err)
	sum := sha256.Sum256(spki.PublicKey.Bytes)
	assert.Equal(tb, sum[:20], leaf.SubjectKeyId)
}

func TestSignSerialsAreRandom(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)
	seen := map[string]bool{}
	long := 0
	for range 64 {
		issued, err := ca.Sign(signNow, rootMaterial(root), signPolicy, csr, workloadID, 0)
		require.NoError(t, err)
		sn := issued.Leaf.SerialNumber
		assert.False(t, seen[sn.String()], "repeated serial %s", sn)
		seen[sn.String()] = true
		if sn.BitLen() > 120 {
			long++
		}
	}
	// A 128-bit random serial is over 120 bits long with probability
	// 1-2^-8; a counter or a short random value would not be.
	assert.Greater(t, long, 48)
}

func TestSignKeyUsageByKeyType(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	tests := []struct {
		kt   testca.KeyType
		want x509.KeyUsage
	}{
		{testca.ECP256, x509.KeyUsageDigitalSignature},
		{testca.ECP384, x509.KeyUsageDigitalSignature},
		{testca.ECP521, x509.KeyUsageDigitalSignature},
		{testca.Ed25519, x509.KeyUsageDigitalSignature},
		{testca.RSA2048, x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment},
	}
	for _, tt := range tests {
		t.Run(string(tt.kt), func(t *testing.T) {
			issued, err := ca.Sign(signNow, rootMaterial(root), signPolicy, parsedCSR(t, testca.NewKey(t, tt.kt), nil), workloadID, 0)
			require.NoError(t, err)
			assert.Equal(t, tt.want, issued.Leaf.KeyUsage)
			assertSKID(t, issued.Leaf)
			verifySVID(t, issued, []*x509.Certificate{root.Cert})
		})
	}
}

// The CSR asks for a subject, CA powers and extra key usages; only the key
// is taken from it.
func TestSignIgnoresCSRContent(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	bc, err := asn1.Marshal(struct {
		IsCA       bool `asn1:"optional"`
		MaxPathLen int  `asn1:"optional,default:-1"`
	}{IsCA: true, MaxPathLen: 5})
	require.NoError(t, err)
	ku, err := asn1.Marshal(asn1.BitString{Bytes: []byte{0x06}, BitLength: 7}) // keyCertSign|cRLSign
	require.NoError(t, err)
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "admin", Organization: []string{"example.org"}},
		ExtraExtensions: []pkix.Extension{
			{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: bc},
			{Id: asn1.ObjectIdentifier{2, 5, 29, 15}, Critical: true, Value: ku},
		},
	})

	issued, err := ca.Sign(signNow, rootMaterial(root), signPolicy, csr, workloadID, 0)
	require.NoError(t, err)
	leaf := issued.Leaf
	assert.Equal(t, []byte{0x30, 0x00}, leaf.RawSubject)
	assert.False(t, leaf.IsCA)
	assert.Equal(t, -1, leaf.MaxPathLen)
	assert.Equal(t, x509.KeyUsageDigitalSignature, leaf.KeyUsage)
	assert.Equal(t, []*url.URL{workloadID.URL()}, leaf.URIs, "identity comes from the caller")
	verifySVID(t, issued, []*x509.Certificate{root.Cert})
}

func TestSignTTL(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)
	day := 24 * time.Hour
	tests := []struct {
		name   string
		policy ca.Policy
		ttl    time.Duration
		want   time.Duration // leaf NotAfter - now
	}{
		{"zero ttl, zero policy: 24h", signPolicy, 0, day},
		{"explicit ttl", signPolicy, 90 * time.Minute, 90 * time.Minute},
		{"zero policy max is 90 days", signPolicy, 90 * day, 90 * day},
		{"zero ttl: policy default", ca.Policy{TrustDomain: signTD, DefaultTTL: time.Hour, MaxTTL: 2 * time.Hour}, 0, time.Hour},
		{"ttl equal to max", ca.Policy{TrustDomain: signTD, DefaultTTL: time.Hour, MaxTTL: 2 * time.Hour}, 2 * time.Hour, 2 * time.Hour},
		{"default capped by a shorter max", ca.Policy{TrustDomain: signTD, MaxTTL: time.Hour}, 0, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			issued, err := ca.Sign(signNow, rootMaterial(root), tt.policy, csr, workloadID, tt.ttl)
			require.NoError(t, err)
			assert.Equal(t, signNow.Add(tt.want), issued.Leaf.NotAfter)
		})
	}
}

func TestSignClampsToChain(t *testing.T) {
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)
	const ttl = 24 * time.Hour

	shortRoot := newSignRoot(t, 2*time.Hour, testca.ECP256)

	longRoot := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	shortMid, shortMidKey := newSubCA(t, longRoot.Cert, longRoot.Key, signNow.Add(-time.Hour), signNow.Add(3*time.Hour), nil)

	// An intermediate that outlives its root: the root still bounds the leaf.
	midOutlives, midOutlivesKey := newSubCA(t, shortRoot.Cert, shortRoot.Key, signNow.Add(-time.Hour), signNow.Add(48*time.Hour), nil)

	// Two levels, the upper one expiring first.
	upper, upperKey := newSubCA(t, longRoot.Cert, longRoot.Key, signNow.Add(-time.Hour), signNow.Add(4*time.Hour), nil)
	lower, lowerKey := newSubCA(t, upper, upperKey, signNow.Add(-time.Hour), signNow.Add(48*time.Hour), nil)

	// Rotation: an old root about to leave is still published, but the
	// signing root is the new one and the old one must not bound the leaf.
	oldRoot := newSignRoot(t, time.Hour, testca.ECP256)

	tests := []struct {
		name string
		m    ca.SigningMaterial
		want time.Time
	}{
		{"root expires first", rootMaterial(shortRoot), shortRoot.Cert.NotAfter},
		{"intermediate expires first",
			ca.SigningMaterial{Cert: shortMid, Key: shortMidKey, Roots: []*x509.Certificate{longRoot.Cert}},
			shortMid.NotAfter},
		{"root of the chain expires first",
			ca.SigningMaterial{Cert: midOutlives, Key: midOutlivesKey, Roots: []*x509.Certificate{shortRoot.Cert}},
			shortRoot.Cert.NotAfter},
		{"upper intermediate expires first",
			ca.SigningMaterial{Cert: lower, Key: lowerKey, Intermediates: []*x509.Certificate{upper}, Roots: []*x509.Certificate{longRoot.Cert}},
			upper.NotAfter},
		{"unrelated old root does not bound",
			ca.SigningMaterial{Cert: longRoot.Cert, Key: longRoot.Key, Roots: []*x509.Certificate{oldRoot.Cert, longRoot.Cert}},
			signNow.Add(ttl)},
		{"unrelated old root does not bound a plug-in chain",
			ca.SigningMaterial{Cert: lower, Key: lowerKey, Intermediates: []*x509.Certificate{upper}, Roots: []*x509.Certificate{oldRoot.Cert, longRoot.Cert}},
			upper.NotAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			issued, err := ca.Sign(signNow, tt.m, signPolicy, csr, workloadID, ttl)
			require.NoError(t, err)
			assert.Equal(t, tt.want, issued.Leaf.NotAfter)
			verifySVID(t, issued, tt.m.Roots)
		})
	}
}

// Plug-in CA mode: the signing certificate is an intermediate, and the
// chain a workload receives must let a peer reach the root.
func TestSignPluginChain(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.RSA2048)
	upper, upperKey := newSubCA(t, root.Cert, root.Key, signNow.Add(-time.Hour), signNow.Add(30*24*time.Hour), nil)
	lower, lowerKey := newSubCA(t, upper, upperKey, signNow.Add(-time.Hour), signNow.Add(30*24*time.Hour), nil)
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)

	t.Run("one intermediate", func(t *testing.T) {
		m := ca.SigningMaterial{Cert: upper, Key: upperKey, Roots: []*x509.Certificate{root.Cert}}
		issued, err := ca.Sign(signNow, m, signPolicy, csr, workloadID, 0)
		require.NoError(t, err)
		assert.Equal(t, []*x509.Certificate{issued.Leaf, upper, root.Cert}, issued.Chain)
		assert.Equal(t, upper.SubjectKeyId, issued.Leaf.AuthorityKeyId)
		verifySVID(t, issued, m.Roots)
	})
	t.Run("two intermediates", func(t *testing.T) {
		m := ca.SigningMaterial{Cert: lower, Key: lowerKey, Intermediates: []*x509.Certificate{upper}, Roots: []*x509.Certificate{root.Cert}}
		issued, err := ca.Sign(signNow, m, signPolicy, csr, workloadID, 0)
		require.NoError(t, err)
		assert.Equal(t, []*x509.Certificate{issued.Leaf, lower, upper, root.Cert}, issued.Chain)
		assert.Equal(t, []*x509.Certificate{root.Cert}, issued.Roots)
		verifySVID(t, issued, m.Roots)

		// Without the intermediates the peer cannot build a path: the chain
		// is what makes it verify, not luck.
		_, _, err = x509svid.ParseAndVerify([][]byte{issued.Leaf.Raw}, x509bundle.FromX509Authorities(signTD, m.Roots), x509svid.WithTime(signNow))
		assert.Error(t, err)
	})
}

func TestIssuedPEM(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	other := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	mid, midKey := newSubCA(t, root.Cert, root.Key, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), nil)
	m := ca.SigningMaterial{Cert: mid, Key: midKey, Roots: []*x509.Certificate{other.Cert, root.Cert}}
	issued, err := ca.Sign(signNow, m, signPolicy, parsedCSR(t, testca.NewKey(t, testca.ECP256), nil), workloadID, 0)
	require.NoError(t, err)

	assert.Equal(t, []*x509.Certificate{issued.Leaf, mid}, decodePEMCerts(t, issued.ChainPEM()), "cert-chain.pem: leaf and intermediates, no roots")
	assert.Equal(t, []*x509.Certificate{other.Cert, root.Cert}, decodePEMCerts(t, issued.RootsPEM()))
}

func decodePEMCerts(t *testing.T, data []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		require.Equal(t, "CERTIFICATE", block.Type)
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
	require.Empty(t, bytes.TrimSpace(data))
	return out
}

// signCase is one call to Sign; refusal cases edit a working one.
type signCase struct {
	now    time.Time
	m      ca.SigningMaterial
	policy ca.Policy
	csr    *x509.CertificateRequest
	id     spiffeid.ID
	ttl    time.Duration
}

func TestSignRefuses(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	otherRoot := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	expiredRoot := testca.New(t, signTD.Name(), testca.Options{NotBefore: signNow.Add(-48 * time.Hour), NotAfter: signNow.Add(-time.Hour)})
	mid, midKey := newSubCA(t, root.Cert, root.Key, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), nil)
	lower, lowerKey := newSubCA(t, mid, midKey, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), nil)
	expiredMid, expiredMidKey := newSubCA(t, root.Cert, root.Key, signNow.Add(-48*time.Hour), signNow.Add(-time.Hour), nil)
	underExpiredMid, underExpiredMidKey := newSubCA(t, expiredMid, expiredMidKey, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), nil)
	midUnderExpiredRoot, midUnderExpiredRootKey := newSubCA(t, expiredRoot.Cert, expiredRoot.Key, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), nil)
	notCA, notCAKey := newSubCA(t, root.Cert, root.Key, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), func(c *x509.Certificate) {
		c.IsCA = false
		c.KeyUsage = x509.KeyUsageDigitalSignature
	})
	// Go does not stop a non-CA from signing; verifiers do.
	underNotCA, underNotCAKey := newSubCA(t, notCA, notCAKey, signNow.Add(-time.Hour), signNow.Add(24*time.Hour), nil)
	noCertSign := testca.New(t, signTD.Name(), testca.Options{
		NotBefore: signNow.Add(-time.Hour), NotAfter: signNow.Add(24 * time.Hour),
		Mutate: func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageCRLSign },
	})
	future := testca.New(t, signTD.Name(), testca.Options{NotBefore: signNow.Add(time.Hour), NotAfter: signNow.Add(48 * time.Hour)})

	ecKey := testca.NewKey(t, testca.ECP256)
	csrWith := func(tmpl *x509.CertificateRequest) *x509.CertificateRequest { return parsedCSR(t, ecKey, tmpl) }
	// A weak key can reach Sign if a caller parses the CSR itself.
	weakCSR, err := x509.ParseCertificateRequest(newCSR(t, testca.NewKey(t, testca.RSA1024), nil))
	require.NoError(t, err)

	base := func() signCase {
		return signCase{now: signNow, m: rootMaterial(root), policy: signPolicy, csr: csrWith(nil), id: workloadID, ttl: time.Hour}
	}
	policyFault := errors.New("policy fault: no sentinel")

	tests := []struct {
		name string
		edit func(*signCase)
		want error  // sentinel; policyFault means "none of them"
		msg  string // in the message
	}{
		// Identity.
		{"zero id", func(c *signCase) { c.id = spiffeid.ID{} }, ca.ErrIdentityNotAllowed, "empty SPIFFE ID"},
		{"id in another trust domain", func(c *signCase) { c.id = spiffeid.RequireFromString("spiffe://evil.org/ns/default/sa/web") }, ca.ErrIdentityNotAllowed, `"spiffe://evil.org/ns/default/sa/web" is not in trust domain "example.org"`},
		{"trust domain id", func(c *signCase) { c.id = signTD.ID() }, ca.ErrIdentityNotAllowed, "has no path"},

		// CSR names.
		{"no CSR", func(c *signCase) { c.csr = nil }, ca.ErrInvalidCSR, "no CSR"},
		{"weak key bypassing ParseCSR", func(c *signCase) { c.csr = weakCSR }, ca.ErrInvalidCSR, "1024 bits"},
		{"DNS SAN", func(c *signCase) { c.csr = csrWith(&x509.CertificateRequest{DNSNames: []string{"web.example.org"}}) }, ca.ErrInvalidCSR, `DNS SANs ["web.example.org"]`},
		{"DNS SAN next to the right URI", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{DNSNames: []string{"web"}, URIs: []*url.URL{workloadID.URL()}})
		}, ca.ErrInvalidCSR, "DNS SANs"},
		{"IP SAN", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}})
		}, ca.ErrInvalidCSR, "IP SANs [10.0.0.1]"},
		{"email SAN", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{EmailAddresses: []string{"a@example.org"}})
		}, ca.ErrInvalidCSR, "email SANs"},
		{"URI SAN for another workload", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{URIs: uris("spiffe://example.org/ns/kube-system/sa/admin")})
		}, ca.ErrIdentityNotAllowed, `URI SAN "spiffe://example.org/ns/kube-system/sa/admin", but the caller proved "spiffe://example.org/ns/default/sa/web"`},
		{"URI SAN in another trust domain", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{URIs: uris("spiffe://evil.org/ns/default/sa/web")})
		}, ca.ErrIdentityNotAllowed, "URI SAN"},
		{"URI SAN differing in case", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{URIs: uris("spiffe://EXAMPLE.org/ns/default/sa/web")})
		}, ca.ErrIdentityNotAllowed, "URI SAN"},
		{"URI SAN percent-encoded", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{URIs: uris("spiffe://example.org/ns/default/sa/w%65b")})
		}, ca.ErrIdentityNotAllowed, "URI SAN"},
		{"URI SAN with trailing slash", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{URIs: uris(workloadID.String() + "/")})
		}, ca.ErrIdentityNotAllowed, "URI SAN"},
		{"two URI SANs, both right", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{URIs: uris(workloadID.String(), workloadID.String())})
		}, ca.ErrIdentityNotAllowed, "2 URI SANs"},
		{"right URI SAN then another", func(c *signCase) {
			c.csr = csrWith(&x509.CertificateRequest{URIs: uris(workloadID.String(), "spiffe://example.org/admin")})
		}, ca.ErrIdentityNotAllowed, "2 URI SANs"},

		// TTL.
		{"negative ttl", func(c *signCase) { c.ttl = -time.Second }, ca.ErrInvalidTTL, "-1s is negative"},
		{"ttl over default max", func(c *signCase) { c.ttl = 90*24*time.Hour + time.Second }, ca.ErrInvalidTTL, "exceeds the maximum of 2160h0m0s"},
		{"ttl over policy max", func(c *signCase) {
			c.policy.MaxTTL = 2 * time.Hour
			c.ttl = 2*time.Hour + time.Nanosecond
		}, ca.ErrInvalidTTL, "exceeds the maximum of 2h0m0s"},

		// Policy: configuration faults, not the caller's.
		{"policy without trust domain", func(c *signCase) { c.policy.TrustDomain = spiffeid.TrustDomain{} }, policyFault, "trust domain not set"},
		{"policy with negative TTL", func(c *signCase) { c.policy.MaxTTL = -time.Hour }, policyFault, "negative TTL"},
		{"policy default over max", func(c *signCase) {
			c.policy.DefaultTTL = 3 * time.Hour
			c.policy.MaxTTL = 2 * time.Hour
		}, policyFault, "default TTL 3h0m0s exceeds max TTL 2h0m0s"},

		// Signing material.
		{"no certificate", func(c *signCase) { c.m.Cert = nil }, ca.ErrInvalidSigningMaterial, "no signing certificate"},
		{"no key", func(c *signCase) { c.m.Key = nil }, ca.ErrInvalidSigningMaterial, "no signing key"},
		{"key of another CA", func(c *signCase) { c.m.Key = otherRoot.Key }, ca.ErrInvalidSigningMaterial, "signing key does not match certificate"},
		{"certificate is not a CA", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: notCA, Key: notCAKey, Roots: []*x509.Certificate{root.Cert}}
		}, ca.ErrInvalidSigningMaterial, "is not a CA"},
		{"CA without keyCertSign", func(c *signCase) { c.m = rootMaterial(noCertSign) }, ca.ErrInvalidSigningMaterial, "lacks keyCertSign"},
		{"expired CA", func(c *signCase) { c.now = root.Cert.NotAfter.Add(time.Second) }, ca.ErrInvalidSigningMaterial, "expired at"},
		{"CA not yet valid", func(c *signCase) { c.m = rootMaterial(future) }, ca.ErrInvalidSigningMaterial, "not valid before"},
		{"no roots", func(c *signCase) { c.m.Roots = nil }, ca.ErrInvalidSigningMaterial, "no roots"},
		{"nil root", func(c *signCase) { c.m.Roots = []*x509.Certificate{root.Cert, nil} }, ca.ErrInvalidSigningMaterial, "root 1 is nil"},
		{"self-signed CA not among the roots", func(c *signCase) { c.m.Roots = []*x509.Certificate{otherRoot.Cert} }, ca.ErrInvalidSigningMaterial, "no valid root among 1 issued"},
		{"intermediate under another root", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: mid, Key: midKey, Roots: []*x509.Certificate{otherRoot.Cert}}
		}, ca.ErrInvalidSigningMaterial, "no valid root among 1 issued"},
		{"missing intermediate", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: lower, Key: lowerKey, Roots: []*x509.Certificate{root.Cert}}
		}, ca.ErrInvalidSigningMaterial, "no valid root"},
		{"intermediate that did not issue the CA", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: lower, Key: lowerKey, Intermediates: []*x509.Certificate{expiredMid}, Roots: []*x509.Certificate{root.Cert}}
		}, ca.ErrInvalidSigningMaterial, "did not issue"},
		{"intermediate that is not a CA", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: underNotCA, Key: underNotCAKey, Intermediates: []*x509.Certificate{notCA}, Roots: []*x509.Certificate{root.Cert}}
		}, ca.ErrInvalidSigningMaterial, "is not a CA"},
		{"nil intermediate", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: lower, Key: lowerKey, Intermediates: []*x509.Certificate{nil}, Roots: []*x509.Certificate{root.Cert}}
		}, ca.ErrInvalidSigningMaterial, "intermediate 0 is nil"},
		{"expired intermediate", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: underExpiredMid, Key: underExpiredMidKey, Intermediates: []*x509.Certificate{expiredMid}, Roots: []*x509.Certificate{root.Cert}}
		}, ca.ErrInvalidSigningMaterial, "expired at"},
		{"root listed as intermediate", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: mid, Key: midKey, Intermediates: []*x509.Certificate{root.Cert}, Roots: []*x509.Certificate{root.Cert}}
		}, ca.ErrInvalidSigningMaterial, "is a root; list it only in Roots"},
		{"root with intermediates", func(c *signCase) { c.m.Intermediates = []*x509.Certificate{mid} }, ca.ErrInvalidSigningMaterial, "is a root but has 1 intermediates"},
		{"only root of the chain expired", func(c *signCase) {
			c.m = ca.SigningMaterial{Cert: midUnderExpiredRoot, Key: midUnderExpiredRootKey, Roots: []*x509.Certificate{expiredRoot.Cert}}
		}, ca.ErrInvalidSigningMaterial, "no valid root"},
	}
	sentinels := []error{ca.ErrInvalidCSR, ca.ErrIdentityNotAllowed, ca.ErrInvalidTTL, ca.ErrInvalidSigningMaterial}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.edit(&c)
			issued, err := ca.Sign(c.now, c.m, c.policy, c.csr, c.id, c.ttl)
			require.Error(t, err)
			assert.Nil(t, issued)
			assert.True(t, strings.HasPrefix(err.Error(), "ca: "), err.Error())
			assert.Contains(t, err.Error(), tt.msg)
			// Exactly one sentinel, so a transport maps it one way.
			for _, s := range sentinels {
				assert.Equal(t, s == tt.want, errors.Is(err, s), "errors.Is(%v): %v", s, err)
			}
		})
	}

	// The base case itself must pass, or every refusal above proves nothing.
	c := base()
	_, err = ca.Sign(c.now, c.m, c.policy, c.csr, c.id, c.ttl)
	require.NoError(t, err)
}

// A CSR whose only URI SAN is exactly the proven ID is fine, and so is one
// with none.
func TestSignURISANMatchingID(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	for name, tmpl := range map[string]*x509.CertificateRequest{
		"none":     nil,
		"matching": {URIs: []*url.URL{workloadID.URL()}},
	} {
		t.Run(name, func(t *testing.T) {
			issued, err := ca.Sign(signNow, rootMaterial(root), signPolicy, parsedCSR(t, testca.NewKey(t, testca.ECP256), tmpl), workloadID, 0)
			require.NoError(t, err)
			verifySVID(t, issued, []*x509.Certificate{root.Cert})
		})
	}
}

// OpenSSL is a second, independent verifier, run in strict mode: it checks
// RFC 5280 details Go does not (a critical SAN with an empty subject, key
// identifiers), and the purposes a TLS peer would ask for.
func TestSignVerifiesWithOpenSSL(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl not on PATH")
	}
	ecRoot := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	rsaRoot := newSignRoot(t, 365*24*time.Hour, testca.RSA2048)
	upper, upperKey := newSubCA(t, rsaRoot.Cert, rsaRoot.Key, signNow.Add(-time.Hour), signNow.Add(30*24*time.Hour), nil)
	lower, lowerKey := newSubCA(t, upper, upperKey, signNow.Add(-time.Hour), signNow.Add(30*24*time.Hour), nil)
	oldRoot := newSignRoot(t, 2*time.Hour, testca.ECP256)

	materials := map[string]ca.SigningMaterial{
		"self-signed root": rootMaterial(ecRoot),
		"plug-in chain":    {Cert: lower, Key: lowerKey, Intermediates: []*x509.Certificate{upper}, Roots: []*x509.Certificate{rsaRoot.Cert}},
		"rotation":         {Cert: ecRoot.Cert, Key: ecRoot.Key, Roots: []*x509.Certificate{oldRoot.Cert, ecRoot.Cert}},
	}
	for mName, m := range materials {
		for _, kt := range []testca.KeyType{testca.ECP256, testca.RSA2048, testca.Ed25519} {
			t.Run(mName+"/"+string(kt), func(t *testing.T) {
				issued, err := ca.Sign(signNow, m, signPolicy, parsedCSR(t, testca.NewKey(t, kt), nil), workloadID, 0)
				require.NoError(t, err)
				dir := t.TempDir()
				write := func(name string, data []byte) string {
					p := filepath.Join(dir, name)
					require.NoError(t, os.WriteFile(p, data, 0o600))
					return p
				}
				chain := issued.Chain[:len(issued.Chain)-len(issued.Roots)]
				leaf := write("leaf.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: issued.Leaf.Raw}))
				roots := write("roots.pem", issued.RootsPEM())
				args := []string{"verify", "-x509_strict", "-attime", strconv.FormatInt(signNow.Unix(), 10), "-CAfile", roots}
				if len(chain) > 1 {
					var buf bytes.Buffer
					for _, c := range chain[1:] {
						require.NoError(t, pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
					}
					args = append(args, "-untrusted", write("intermediates.pem", buf.Bytes()))
				}
				for _, purpose := range []string{"sslserver", "sslclient"} {
					cmd := exec.Command(openssl, append(args, "-purpose", purpose, leaf)...)
					out, err := cmd.CombinedOutput()
					require.NoError(t, err, "%s\n%s", cmd, out)
					assert.Contains(t, string(out), "OK")
				}
			})
		}
	}
}
