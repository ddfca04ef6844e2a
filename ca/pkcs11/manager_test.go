//go:build cgo

package pkcs11

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/hsmtest"
)

func open(t testing.TB, module, label, pin string) *Manager {
	t.Helper()
	m, err := New(Config{Module: module, TokenLabel: label, PIN: pin})
	require.NoError(t, err)
	return m
}

// selfSigned signs a certificate with key and checks its signature.
func selfSigned(t *testing.T, key crypto.Signer) {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pkcs11 test"},
		NotBefore:             time.Unix(1_700_000_000, 0),
		NotAfter:              time.Unix(1_700_086_400, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	require.NoError(t, cert.CheckSignatureFrom(cert))
}

func TestKeyLifecycle(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	ctx := context.Background()
	refs := map[ca.KeyType]string{}
	pubs := map[ca.KeyType]crypto.PublicKey{}
	m := open(t, module, label, pin)
	assert.Equal(t, `pkcs11 token "trustbridge-test" (libsofthsm2.so)`, m.String())
	for _, kt := range []ca.KeyType{ca.KeyECP256, ca.KeyECP384, ca.KeyRSA2048, ca.KeyRSA3072, ca.KeyRSA4096} {
		t.Run(string(kt), func(t *testing.T) {
			key, ref, err := m.CreateKey(ctx, kt, "root-"+string(kt))
			require.NoError(t, err)
			id, err := ParseRef(ref)
			require.NoError(t, err)
			assert.Len(t, id, idLen)
			selfSigned(t, key)
			assertNotExportable(t, m, key, id, "root-"+string(kt))
			refs[kt], pubs[kt] = ref, key.Public()
		})
	}
	require.NoError(t, m.Close())

	// A restart: a new Manager finds every key by its reference alone.
	m2 := open(t, module, label, pin)
	t.Cleanup(func() { _ = m2.Close() })
	for kt, ref := range refs {
		key, err := m2.FindKey(ctx, ref)
		require.NoError(t, err, kt)
		assert.True(t, key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(pubs[kt]), kt)
		selfSigned(t, key)
	}

	ref := refs[ca.KeyECP256]
	require.NoError(t, m2.DestroyKey(ctx, ref))
	_, err := m2.FindKey(ctx, ref)
	require.ErrorIs(t, err, ca.ErrKeyNotFound)
	assert.ErrorContains(t, err, ref)
	require.NoError(t, m2.DestroyKey(ctx, ref), "destroying a key already gone is not an error")
	// The other keys are untouched.
	_, err = m2.FindKey(ctx, refs[ca.KeyECP384])
	require.NoError(t, err)
}

// assertNotExportable checks the private key's attributes in the token:
// sensitive, never extractable, with the id and label CreateKey gave it.
func assertNotExportable(t *testing.T, m *Manager, key crypto.Signer, id []byte, label string) {
	t.Helper()
	attrs, err := m.p11.GetAttributes(key, []crypto11.AttributeType{
		crypto11.CkaSensitive, crypto11.CkaExtractable, crypto11.CkaToken, crypto11.CkaId, crypto11.CkaLabel,
	})
	require.NoError(t, err)
	assert.Equal(t, []byte{1}, attrs[crypto11.CkaSensitive].Value, "CKA_SENSITIVE")
	assert.Equal(t, []byte{0}, attrs[crypto11.CkaExtractable].Value, "CKA_EXTRACTABLE")
	assert.Equal(t, []byte{1}, attrs[crypto11.CkaToken].Value, "CKA_TOKEN (kept across sessions)")
	assert.Equal(t, id, attrs[crypto11.CkaId].Value)
	assert.Equal(t, label, string(attrs[crypto11.CkaLabel].Value))
}

func TestCreateKeyRefusals(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	m := open(t, module, label, pin)
	t.Cleanup(func() { _ = m.Close() })

	_, _, err := m.CreateKey(context.Background(), "ed25519", "x")
	assert.ErrorContains(t, err, `unknown key type "ed25519"`)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = m.CreateKey(ctx, ca.KeyECP256, "x")
	require.ErrorIs(t, err, context.Canceled)
	_, err = m.FindKey(ctx, formatRef(make([]byte, idLen)))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, m.DestroyKey(ctx, formatRef(make([]byte, idLen))), context.Canceled)

	_, err = m.FindKey(context.Background(), "pkcs11:label=root")
	assert.ErrorContains(t, err, `does not start with "pkcs11:id="`)
	_, err = m.FindKey(context.Background(), formatRef(make([]byte, idLen)))
	require.ErrorIs(t, err, ca.ErrKeyNotFound)
}

func TestOpenErrors(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	tests := []struct {
		name  string
		cfg   Config
		parts []string
	}{
		{"wrong PIN", Config{Module: module, TokenLabel: label, PIN: "9999"},
			[]string{"PIN was refused by", `token "trustbridge-test"`, "CKR_PIN_INCORRECT", "--pkcs11-pin-file", PINEnv}},
		{"unknown token", Config{Module: module, TokenLabel: "nope", PIN: pin},
			[]string{`token "nope" not found in module ` + module, "softhsm2-util --show-slots"}},
		{"missing module", Config{Module: "/nonexistent/libhsm.so", TokenLabel: label, PIN: pin},
			[]string{"--pkcs11-module /nonexistent/libhsm.so: no such file"}},
		{"not a module", Config{Module: "/etc/hostname", TokenLabel: label, PIN: pin},
			[]string{"--pkcs11-module /etc/hostname: cannot load it as a PKCS#11 library"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.cfg)
			require.Error(t, err)
			assert.Nil(t, m)
			t.Log(err)
			for _, p := range tc.parts {
				assert.ErrorContains(t, err, p)
			}
			assert.NotContains(t, err.Error(), "9999", "the PIN is never in an error")
		})
	}
	// After the refusals, the right PIN still opens the token.
	require.NoError(t, open(t, module, label, pin).Close())
}

func TestOpenBySlot(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	m := open(t, module, label, pin)
	_, ref, err := m.CreateKey(context.Background(), ca.KeyECP256, "by-slot")
	require.NoError(t, err)
	require.NoError(t, m.Close())

	slot := hsmtest.Slot(t, label)
	m, err = New(Config{Module: module, Slot: &slot, PIN: pin})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	assert.Equal(t, fmt.Sprintf("pkcs11 slot %d (libsofthsm2.so)", slot), m.String())
	key, err := m.FindKey(context.Background(), ref)
	require.NoError(t, err)
	selfSigned(t, key)
}

func TestConcurrentSign(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	m := open(t, module, label, pin)
	t.Cleanup(func() { _ = m.Close() })
	key, _, err := m.CreateKey(context.Background(), ca.KeyECP256, "concurrent")
	require.NoError(t, err)
	pub := key.Public().(*ecdsa.PublicKey)
	digest := sha256.Sum256([]byte("trustbridge"))

	var wg sync.WaitGroup
	errs := make(chan error, 8*20)
	for range 8 {
		wg.Go(func() {
			for range 20 {
				sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
				if err != nil {
					errs <- err
					continue
				}
				if !ecdsa.VerifyASN1(pub, digest[:], sig) {
					errs <- assert.AnError
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func BenchmarkSign(b *testing.B) {
	digest := sha256.Sum256([]byte("trustbridge"))
	sign := func(b *testing.B, key crypto.Signer) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := key.Sign(rand.Reader, digest[:], crypto.SHA256); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("baseline:file", func(b *testing.B) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(b, err)
		sign(b, key)
	})
	b.Run("softhsm2", func(b *testing.B) {
		module, label, pin := hsmtest.Token(b)
		m := open(b, module, label, pin)
		b.Cleanup(func() { _ = m.Close() })
		key, _, err := m.CreateKey(context.Background(), ca.KeyECP256, "bench")
		require.NoError(b, err)
		sign(b, key)
	})
}

// BenchmarkSignInterleaved alternates one in-memory and one SoftHSM2
// signature per iteration and reports the token's time over the in-memory
// one (x-file), which a loaded machine skews less than two separate runs.
func BenchmarkSignInterleaved(b *testing.B) {
	digest := sha256.Sum256([]byte("trustbridge"))
	file, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(b, err)
	module, label, pin := hsmtest.Token(b)
	m := open(b, module, label, pin)
	b.Cleanup(func() { _ = m.Close() })
	hsm, _, err := m.CreateKey(context.Background(), ca.KeyECP256, "bench")
	require.NoError(b, err)
	var inFile, inHSM time.Duration
	for b.Loop() {
		for _, k := range []struct {
			key crypto.Signer
			sum *time.Duration
		}{{file, &inFile}, {hsm, &inHSM}} {
			start := time.Now()
			if _, err := k.key.Sign(rand.Reader, digest[:], crypto.SHA256); err != nil {
				b.Fatal(err)
			}
			*k.sum += time.Since(start)
		}
	}
	b.ReportMetric(float64(inHSM)/float64(inFile), "x-file")
}
