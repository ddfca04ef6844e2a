package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var pluginT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// pluginPKI is root → [mid →] signing CA, the shape of Istio's cacerts.
type pluginPKI struct {
	root   *testca.CA
	mid    *x509.Certificate // nil without a middle intermediate
	midKey crypto.Signer
	cert   *x509.Certificate
	key    crypto.Signer
}

type pluginPKIOptions struct {
	now      time.Time      // centre of the validity windows; default pluginT0
	keyType  testca.KeyType // of the signing CA; default ECP256
	rootType testca.KeyType // default ECP256
	midType  testca.KeyType // set to add a middle intermediate
	rootTD   string         // default example.org
	rootOpt  func(*x509.Certificate)
	midOpt   func(*x509.Certificate)
	certOpt  func(*x509.Certificate)
	certKey  crypto.Signer    // overrides keyType
	window   [2]time.Duration // signing CA validity around now; default -1h..+24h
}

func pluginCATemplate(name string, nb, na time.Time) *x509.Certificate {
	sn, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name, SerialNumber: sn.String()},
		NotBefore:             nb,
		NotAfter:              na,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
}

func newPluginPKI(t *testing.T, o pluginPKIOptions) *pluginPKI {
	t.Helper()
	if o.now.IsZero() {
		o.now = pluginT0
	}
	if o.keyType == "" {
		o.keyType = testca.ECP256
	}
	if o.rootType == "" {
		o.rootType = testca.ECP256
	}
	if o.rootTD == "" {
		o.rootTD = tdPlugin.Name()
	}
	if o.window == [2]time.Duration{} {
		o.window = [2]time.Duration{-time.Hour, 24 * time.Hour}
	}
	p := &pluginPKI{root: testca.New(t, o.rootTD, testca.Options{
		KeyType:   o.rootType,
		NotBefore: o.now.Add(-24 * time.Hour),
		NotAfter:  o.now.Add(365 * 24 * time.Hour),
		Mutate:    o.rootOpt,
	})}
	parent, parentKey := p.root.Cert, p.root.Key
	if o.midType != "" {
		p.midKey = testca.NewKey(t, o.midType)
		tmpl := pluginCATemplate("mid", o.now.Add(-12*time.Hour), o.now.Add(180*24*time.Hour))
		if o.midOpt != nil {
			o.midOpt(tmpl)
		}
		p.mid = testca.Sign(t, tmpl, parent, p.midKey.Public(), parentKey)
		parent, parentKey = p.mid, p.midKey
	}
	p.key = o.certKey
	if p.key == nil {
		p.key = testca.NewKey(t, o.keyType)
	}
	tmpl := pluginCATemplate("signing", o.now.Add(o.window[0]), o.now.Add(o.window[1]))
	if o.certOpt != nil {
		o.certOpt(tmpl)
	}
	p.cert = testca.Sign(t, tmpl, parent, p.key.Public(), parentKey)
	return p
}

var tdPlugin = spiffeid.RequireTrustDomainFromString("example.org")

func pemCerts(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		b.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	return b.Bytes()
}

func pemPKCS8(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// files is the cacerts layout; rootInChain ends cert-chain.pem with the
// root, as Istio's tools do.
func (p *pluginPKI) files(t *testing.T, rootInChain bool) map[string][]byte {
	t.Helper()
	chain := []*x509.Certificate{p.cert}
	if p.mid != nil {
		chain = append(chain, p.mid)
	}
	if rootInChain {
		chain = append(chain, p.root.Cert)
	}
	return map[string][]byte{
		pluginCertFile:  pemCerts(p.cert),
		pluginKeyFile:   pemPKCS8(t, p.key),
		pluginChainFile: pemCerts(chain...),
		pluginRootFile:  pemCerts(p.root.Cert),
	}
}

func writePluginDir(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		// WriteFile keeps the mode of an existing file.
		require.NoError(t, os.Chmod(path, 0o600))
	}
}

func TestLoadPluginDirAccepts(t *testing.T) {
	tests := []struct {
		name        string
		opts        pluginPKIOptions
		rootInChain bool
		edit        func(t *testing.T, p *pluginPKI, files map[string][]byte)
		roots       int
	}{
		{name: "EC, root at end of chain", rootInChain: true, roots: 1},
		{name: "EC, chain without root", roots: 1},
		{name: "EC P-384 SEC1 key", opts: pluginPKIOptions{keyType: testca.ECP384}, roots: 1,
			edit: func(t *testing.T, p *pluginPKI, files map[string][]byte) {
				der, err := x509.MarshalECPrivateKey(p.key.(*ecdsa.PrivateKey))
				require.NoError(t, err)
				files[pluginKeyFile] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
			}},
		{name: "RSA PKCS#1 key, middle intermediate, root at end", rootInChain: true, roots: 1,
			opts: pluginPKIOptions{keyType: testca.RSA2048, rootType: testca.RSA4096, midType: testca.RSA2048},
			edit: func(t *testing.T, p *pluginPKI, files map[string][]byte) {
				files[pluginKeyFile] = pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(p.key.(*rsa.PrivateKey))})
			}},
		{name: "RSA PKCS#8 key, middle intermediate, chain without root", roots: 1,
			opts: pluginPKIOptions{keyType: testca.RSA2048, midType: testca.ECP256}},
		{name: "Ed25519 key", opts: pluginPKIOptions{keyType: testca.Ed25519}, roots: 1},
		{name: "root without URI SAN, as Istio's", rootInChain: true, roots: 1,
			opts: pluginPKIOptions{rootOpt: func(c *x509.Certificate) { c.URIs = nil }}},
		{name: "signing CA and middle intermediate with our SPIFFE ID", roots: 1,
			opts: pluginPKIOptions{midType: testca.ECP256,
				midOpt:  func(c *x509.Certificate) { c.URIs = []*url.URL{tdPlugin.ID().URL()} },
				certOpt: func(c *x509.Certificate) { c.URIs = []*url.URL{tdPlugin.ID().URL()} }}},
		{name: "second root and surrounding whitespace", rootInChain: true, roots: 2,
			edit: func(t *testing.T, p *pluginPKI, files map[string][]byte) {
				other := testca.New(t, tdPlugin.Name())
				files[pluginRootFile] = append(append([]byte("\n\n"), pemCerts(other.Cert, p.root.Cert)...), " \r\n\t"...)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPluginPKI(t, tt.opts)
			files := p.files(t, tt.rootInChain)
			if tt.edit != nil {
				tt.edit(t, p, files)
			}
			dir := t.TempDir()
			writePluginDir(t, dir, files)

			m, warnings, err := LoadPluginDir(dir, tdPlugin, pluginT0)
			require.NoError(t, err)
			assert.Empty(t, warnings)
			assert.True(t, m.Cert.Equal(p.cert))
			assert.True(t, publicKeysMatch(m.Key.Public(), p.key.Public()))
			if p.mid != nil {
				require.Len(t, m.Intermediates, 1)
				assert.True(t, m.Intermediates[0].Equal(p.mid))
			} else {
				assert.Empty(t, m.Intermediates)
			}
			assert.Len(t, m.Roots, tt.roots)
			assert.NotEqual(t, [32]byte{}, m.Digest)
		})
	}
}

func TestLoadPluginDirRefuses(t *testing.T) {
	type edit func(t *testing.T, p *pluginPKI, files map[string][]byte)
	replace := func(name string, data []byte) edit {
		return func(_ *testing.T, _ *pluginPKI, files map[string][]byte) { files[name] = data }
	}
	p224 := func(t *testing.T) crypto.Signer {
		k, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	tests := []struct {
		name string
		opts pluginPKIOptions
		// rootInChain defaults to true; noRootInChain turns it off.
		noRootInChain bool
		edit          edit
		want          string
	}{
		// Reading.
		{name: "ca-cert.pem missing", edit: func(_ *testing.T, _ *pluginPKI, f map[string][]byte) { delete(f, pluginCertFile) },
			want: "ca-cert.pem: open: no such file"},
		{name: "ca-key.pem missing", edit: func(_ *testing.T, _ *pluginPKI, f map[string][]byte) { delete(f, pluginKeyFile) },
			want: "ca-key.pem: open: no such file"},
		{name: "cert-chain.pem missing", edit: func(_ *testing.T, _ *pluginPKI, f map[string][]byte) { delete(f, pluginChainFile) },
			want: "cert-chain.pem: open: no such file"},
		{name: "root-cert.pem missing", edit: func(_ *testing.T, _ *pluginPKI, f map[string][]byte) { delete(f, pluginRootFile) },
			want: "root-cert.pem: open: no such file"},
		{name: "file over 1 MiB", edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) {
			f[pluginRootFile] = append(pemCerts(p.root.Cert), bytes.Repeat([]byte("\n"), maxPluginFileSize)...)
		}, want: "root-cert.pem: larger than 1048576 bytes"},

		// PEM.
		{name: "empty root-cert.pem", edit: replace(pluginRootFile, []byte("\n")), want: "root-cert.pem: no PEM block"},
		{name: "trailing garbage", edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) {
			f[pluginRootFile] = append(pemCerts(p.root.Cert), "junk\n"...)
		}, want: "root-cert.pem: unexpected data at byte"},
		{name: "leading garbage", edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) {
			f[pluginCertFile] = append([]byte("subject=CN=signing\n"), pemCerts(p.cert)...)
		}, want: "ca-cert.pem: unexpected data at byte 0"},
		{name: "malformed block before a good one", edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) {
			f[pluginCertFile] = append([]byte("-----BEGIN CERTIFICATE-----\n!!\n"), pemCerts(p.cert)...)
		}, want: "ca-cert.pem: unexpected data at byte 0"},
		{name: "unexpected block type in chain", edit: func(t *testing.T, p *pluginPKI, f map[string][]byte) {
			f[pluginChainFile] = append(pemCerts(p.cert), pemPKCS8(t, p.key)...)
		}, want: `cert-chain.pem: block 2: unexpected PEM block "PRIVATE KEY", want CERTIFICATE`},
		{name: "two certificates in ca-cert.pem", edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) {
			f[pluginCertFile] = pemCerts(p.cert, p.root.Cert)
		}, want: "ca-cert.pem: holds 2 certificates, want exactly 1"},
		{name: "two keys in ca-key.pem", edit: func(t *testing.T, p *pluginPKI, f map[string][]byte) {
			f[pluginKeyFile] = append(pemPKCS8(t, p.key), pemPKCS8(t, p.key)...)
		}, want: "ca-key.pem: holds 2 PEM blocks, want exactly 1 private key"},
		{name: "encrypted PKCS#8 key", edit: replace(pluginKeyFile, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}})),
			want: `ca-key.pem: unexpected PEM block "ENCRYPTED PRIVATE KEY"`},
		{name: "legacy encrypted key headers", edit: replace(pluginKeyFile, pem.EncodeToMemory(&pem.Block{
			Type: "EC PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: []byte{1},
		})), want: "ca-key.pem: block 1: PEM headers are not supported"},
		{name: "corrupt certificate", edit: replace(pluginCertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{0x30, 0}})),
			want: "ca-cert.pem: certificate 1:"},
		{name: "key that cannot sign", edit: func(t *testing.T, _ *pluginPKI, f map[string][]byte) {
			k, err := ecdh.X25519().GenerateKey(rand.Reader)
			require.NoError(t, err)
			f[pluginKeyFile] = pemPKCS8(t, k)
		}, want: "ca-key.pem: *ecdh.PrivateKey keys cannot sign"},

		// Key.
		{name: "key of another certificate", edit: func(t *testing.T, _ *pluginPKI, f map[string][]byte) {
			f[pluginKeyFile] = pemPKCS8(t, testca.NewKey(t, testca.ECP256))
		}, want: "ca-key.pem: private key does not match the public key of ca-cert.pem"},
		{name: "RSA 1024 signing key", opts: pluginPKIOptions{keyType: testca.RSA1024},
			want: "ca-key.pem: RSA key of 1024 bits is too weak"},
		{name: "P-224 signing key", opts: pluginPKIOptions{certKey: p224(t)},
			want: "ca-key.pem: EC key on P-224 is too weak"},
		{name: "RSA 1024 root", opts: pluginPKIOptions{rootType: testca.RSA1024},
			want: "root-cert.pem: certificate 1: RSA key of 1024 bits is too weak"},
		{name: "RSA 1024 middle intermediate", opts: pluginPKIOptions{midType: testca.RSA1024},
			want: "cert-chain.pem: certificate 2: RSA key of 1024 bits is too weak"},

		// Signing CA.
		{name: "signing cert not a CA", opts: pluginPKIOptions{certOpt: func(c *x509.Certificate) { c.IsCA = false }},
			want: "ca-cert.pem: not a CA certificate"},
		{name: "signing cert without keyCertSign", opts: pluginPKIOptions{certOpt: func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }},
			want: "ca-cert.pem: key usage lacks keyCertSign"},
		{name: "signing cert expired", opts: pluginPKIOptions{window: [2]time.Duration{-48 * time.Hour, -time.Hour}},
			want: "ca-cert.pem: expired at 2026-03-01T11:00:00Z"},
		{name: "signing cert not yet valid", opts: pluginPKIOptions{window: [2]time.Duration{time.Hour, 48 * time.Hour}},
			want: "ca-cert.pem: not valid before 2026-03-01T13:00:00Z"},
		{name: "signing cert of another trust domain", opts: pluginPKIOptions{certOpt: func(c *x509.Certificate) {
			c.URIs = []*url.URL{spiffeid.RequireTrustDomainFromString("other.org").ID().URL()}
		}}, want: `ca-cert.pem: URI SAN "spiffe://other.org" is in trust domain "other.org", want "example.org"`},
		{name: "signing cert with a malformed SPIFFE ID", opts: pluginPKIOptions{certOpt: func(c *x509.Certificate) {
			c.URIs = []*url.URL{{Scheme: "spiffe", Host: "Example.org"}}
		}}, want: `ca-cert.pem: URI SAN "spiffe://Example.org":`},

		// Chain.
		{name: "chain not starting with ca-cert.pem", opts: pluginPKIOptions{midType: testca.ECP256},
			edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) {
				f[pluginChainFile] = pemCerts(p.mid, p.root.Cert)
			},
			want: "cert-chain.pem: first certificate is not the one in ca-cert.pem"},
		{name: "chain out of order", opts: pluginPKIOptions{midType: testca.ECP256},
			edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) {
				f[pluginChainFile] = pemCerts(p.cert, p.root.Cert, p.mid)
			},
			want: "cert-chain.pem: certificate 1 is not issued by certificate 2"},
		{name: "chain missing the middle intermediate", opts: pluginPKIOptions{midType: testca.ECP256}, noRootInChain: true,
			edit: func(_ *testing.T, p *pluginPKI, f map[string][]byte) { f[pluginChainFile] = pemCerts(p.cert) },
			want: "ca-cert.pem does not chain to root-cert.pem through cert-chain.pem"},
		{name: "middle intermediate of another trust domain", opts: pluginPKIOptions{midType: testca.ECP256, midOpt: func(c *x509.Certificate) {
			c.URIs = []*url.URL{spiffeid.RequireTrustDomainFromString("other.org").ID().URL()}
		}}, want: `cert-chain.pem: certificate 2: URI SAN "spiffe://other.org"`},

		// Roots.
		{name: "root-cert.pem holds an unrelated root", edit: func(t *testing.T, _ *pluginPKI, f map[string][]byte) {
			f[pluginRootFile] = pemCerts(testca.New(t, tdPlugin.Name()).Cert)
		}, want: "ca-cert.pem does not chain to root-cert.pem"},
		{name: "root of another trust domain", opts: pluginPKIOptions{rootTD: "other.org"},
			want: `root-cert.pem: certificate 1: URI SAN "spiffe://other.org" is in trust domain "other.org"`},
		{name: "extra root not a CA", edit: func(t *testing.T, p *pluginPKI, f map[string][]byte) {
			leafish := testca.New(t, tdPlugin.Name(), testca.Options{Mutate: func(c *x509.Certificate) { c.IsCA = false; c.KeyUsage = x509.KeyUsageDigitalSignature }})
			f[pluginRootFile] = pemCerts(p.root.Cert, leafish.Cert)
		}, want: "root-cert.pem: certificate 2: not a CA certificate"},
		{name: "extra root without keyCertSign", edit: func(t *testing.T, p *pluginPKI, f map[string][]byte) {
			noSign := testca.New(t, tdPlugin.Name(), testca.Options{Mutate: func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageCRLSign }})
			f[pluginRootFile] = pemCerts(p.root.Cert, noSign.Cert)
		}, want: "root-cert.pem: certificate 2: key usage lacks keyCertSign"},
		{name: "extra weak root", edit: func(t *testing.T, p *pluginPKI, f map[string][]byte) {
			weak := testca.New(t, tdPlugin.Name(), testca.Options{KeyType: testca.RSA1024})
			f[pluginRootFile] = pemCerts(p.root.Cert, weak.Cert)
		}, want: "root-cert.pem: certificate 2: RSA key of 1024 bits is too weak"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPluginPKI(t, tt.opts)
			files := p.files(t, !tt.noRootInChain)
			if tt.edit != nil {
				tt.edit(t, p, files)
			}
			dir := t.TempDir()
			writePluginDir(t, dir, files)

			m, warnings, err := LoadPluginDir(dir, tdPlugin, pluginT0)
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Nil(t, warnings)
			assert.Contains(t, err.Error(), tt.want)
			assert.True(t, strings.HasPrefix(err.Error(), "ca: plug-in CA directory "+dir+": "), err.Error())
		})
	}
}

func TestLoadPluginDirRefusesNonRegularFile(t *testing.T) {
	p := newPluginPKI(t, pluginPKIOptions{})
	dir := t.TempDir()
	files := p.files(t, true)
	delete(files, pluginCertFile)
	writePluginDir(t, dir, files)
	require.NoError(t, os.Mkdir(filepath.Join(dir, pluginCertFile), 0o700))

	_, _, err := LoadPluginDir(dir, tdPlugin, pluginT0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ca-cert.pem: not a regular file")
}

func TestLoadPluginDirKeyPermissions(t *testing.T) {
	tests := []struct {
		mode os.FileMode
		warn bool
	}{
		{mode: 0o600}, {mode: 0o400}, {mode: 0o640, warn: true}, {mode: 0o644, warn: true}, {mode: 0o604, warn: true},
	}
	p := newPluginPKI(t, pluginPKIOptions{})
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			writePluginDir(t, dir, p.files(t, true))
			require.NoError(t, os.Chmod(filepath.Join(dir, pluginKeyFile), tt.mode))

			m, warnings, err := LoadPluginDir(dir, tdPlugin, pluginT0)
			require.NoError(t, err)
			require.NotNil(t, m)
			if tt.warn {
				require.Len(t, warnings, 1)
				assert.Contains(t, warnings[0], filepath.Join(dir, pluginKeyFile)+" is readable by group or others")
			} else {
				assert.Empty(t, warnings)
			}
		})
	}
}

// TestLoadPluginDirFollowsSymlinks mirrors a Kubernetes secret volume,
// whose files are links through "..data" to a timestamped directory.
func TestLoadPluginDirFollowsSymlinks(t *testing.T) {
	p := newPluginPKI(t, pluginPKIOptions{})
	dir := t.TempDir()
	gen := filepath.Join(dir, "..2026_03_01")
	require.NoError(t, os.Mkdir(gen, 0o755))
	writePluginDir(t, gen, p.files(t, true))
	require.NoError(t, os.Symlink(filepath.Base(gen), filepath.Join(dir, "..data")))
	for _, name := range []string{pluginCertFile, pluginKeyFile, pluginChainFile, pluginRootFile} {
		require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)))
	}

	m, _, err := LoadPluginDir(dir, tdPlugin, pluginT0)
	require.NoError(t, err)
	assert.True(t, m.Cert.Equal(p.cert))
}

func TestPluginDigest(t *testing.T) {
	p := newPluginPKI(t, pluginPKIOptions{})
	files := p.files(t, true)
	dir := t.TempDir()
	writePluginDir(t, dir, files)
	first, err := readPluginFiles(dir)
	require.NoError(t, err)

	again, err := readPluginFiles(dir)
	require.NoError(t, err)
	assert.Equal(t, first.digest, again.digest, "same bytes, same digest")

	// The same bytes split differently between two files are different
	// material.
	cert := files[pluginCertFile]
	require.Equal(t, byte('\n'), cert[len(cert)-1])
	files[pluginCertFile] = cert[:len(cert)-1]
	files[pluginKeyFile] = append([]byte("\n"), files[pluginKeyFile]...)
	writePluginDir(t, dir, files)
	moved, err := readPluginFiles(dir)
	require.NoError(t, err)
	assert.NotEqual(t, first.digest, moved.digest)
}

// capturedLogs counts log records per level.
type capturedLogs struct {
	buf bytes.Buffer
}

func (c *capturedLogs) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&c.buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (c *capturedLogs) count(level string) int { return strings.Count(c.buf.String(), "level="+level) }

func signalled(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestPluginWatcherReload(t *testing.T) {
	clk := clocktesting.NewFakeClock(pluginT0)
	dir := t.TempDir()
	a := newPluginPKI(t, pluginPKIOptions{})
	writePluginDir(t, dir, a.files(t, true))
	var logs capturedLogs
	w := NewPluginWatcher(dir, tdPlugin, clk, time.Second, logs.logger())

	require.NoError(t, w.load())
	require.NotNil(t, w.current())
	assert.True(t, w.current().Cert.Equal(a.cert))
	assert.NoError(t, w.lastError())
	assert.True(t, signalled(w.changes()), "first load is a change")
	good := w.current()

	t.Run("unchanged files", func(t *testing.T) {
		require.NoError(t, w.Check())
		assert.Same(t, good, w.current())
		assert.NoError(t, w.lastError())
		assert.False(t, signalled(w.changes()))
	})

	t.Run("invalid change keeps the last good material", func(t *testing.T) {
		other := newPluginPKI(t, pluginPKIOptions{})
		writePluginDir(t, dir, map[string][]byte{pluginKeyFile: pemPKCS8(t, other.key)})
		err := w.Check()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "private key does not match")
		assert.Equal(t, err, w.lastError())
		assert.Same(t, good, w.current())
		assert.False(t, signalled(w.changes()))

		require.Error(t, w.Check(), "still invalid")
		assert.Error(t, w.lastError())
		assert.Equal(t, 1, logs.count("ERROR"), "a persisting problem is logged once")
	})

	b := newPluginPKI(t, pluginPKIOptions{midType: testca.ECP256})
	t.Run("valid new material", func(t *testing.T) {
		writePluginDir(t, dir, b.files(t, false))
		require.NoError(t, w.Check())
		assert.NoError(t, w.lastError())
		assert.True(t, w.current().Cert.Equal(b.cert))
		assert.Len(t, w.current().Intermediates, 1)
		assert.True(t, signalled(w.changes()))

		require.NoError(t, w.Check())
		assert.False(t, signalled(w.changes()), "unchanged files do not signal again")
	})

	t.Run("material that becomes valid without changing", func(t *testing.T) {
		c := newPluginPKI(t, pluginPKIOptions{now: pluginT0.Add(2 * time.Hour)})
		writePluginDir(t, dir, c.files(t, true))
		err := w.Check()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not valid before")
		assert.True(t, w.current().Cert.Equal(b.cert))

		clk.Step(2 * time.Hour)
		require.NoError(t, w.Check())
		assert.NoError(t, w.lastError())
		assert.True(t, w.current().Cert.Equal(c.cert))
		assert.True(t, signalled(w.changes()))
	})

	t.Run("unchanged material that expires", func(t *testing.T) {
		current := w.current()
		clk.SetTime(current.Cert.NotAfter.Add(time.Second))
		err := w.Check()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "ca-cert.pem: expired at")
		assert.Equal(t, err, w.lastError())
		assert.Same(t, current, w.current(), "nothing better to serve")
		assert.False(t, signalled(w.changes()))
	})
}

// racingReader plays a writer that replaces the files between the two
// reads of a snapshot, on the reads listed in changeOn (counted from 1).
func racingReader(t *testing.T, dir string, next map[string][]byte, changeOn ...int) func(string) (*pluginFiles, error) {
	reads := 0
	return func(d string) (*pluginFiles, error) {
		reads++
		f, err := readPluginFiles(d)
		for _, n := range changeOn {
			if n == reads {
				writePluginDir(t, dir, next)
			}
		}
		return f, err
	}
}

func TestPluginWatcherFilesChangingWhileRead(t *testing.T) {
	clk := clocktesting.NewFakeClock(pluginT0)
	dir := t.TempDir()
	a, b := newPluginPKI(t, pluginPKIOptions{}), newPluginPKI(t, pluginPKIOptions{})
	writePluginDir(t, dir, a.files(t, true))
	w := NewPluginWatcher(dir, tdPlugin, clk, time.Second, nil)
	require.NoError(t, w.load())
	require.True(t, signalled(w.changes()))

	// The writer replaces every file right after the first read.
	w.readFiles = racingReader(t, dir, b.files(t, true), 1)
	require.NoError(t, w.Check(), "a writer at work is not an error")
	assert.NoError(t, w.lastError())
	assert.True(t, w.current().Cert.Equal(a.cert))
	assert.False(t, signalled(w.changes()))

	require.NoError(t, w.Check(), "the next check sees the new files")
	assert.True(t, w.current().Cert.Equal(b.cert))
	assert.True(t, signalled(w.changes()))
}

func TestPluginWatcherLoad(t *testing.T) {
	t.Run("retries a directory caught mid-update", func(t *testing.T) {
		dir := t.TempDir()
		a, b := newPluginPKI(t, pluginPKIOptions{}), newPluginPKI(t, pluginPKIOptions{})
		writePluginDir(t, dir, a.files(t, true))
		w := NewPluginWatcher(dir, tdPlugin, clocktesting.NewFakeClock(pluginT0), 0, nil)
		w.readFiles = racingReader(t, dir, b.files(t, true), 1)
		require.NoError(t, w.load())
		assert.True(t, w.current().Cert.Equal(b.cert))
	})
	t.Run("gives up on a directory that never settles", func(t *testing.T) {
		dir := t.TempDir()
		a, b := newPluginPKI(t, pluginPKIOptions{}), newPluginPKI(t, pluginPKIOptions{})
		writePluginDir(t, dir, a.files(t, true))
		w := NewPluginWatcher(dir, tdPlugin, clocktesting.NewFakeClock(pluginT0), 0, nil)
		// Alternate between the two generations on every read.
		reads := 0
		w.readFiles = func(d string) (*pluginFiles, error) {
			reads++
			f, err := readPluginFiles(d)
			if reads%2 == 1 {
				writePluginDir(t, dir, b.files(t, true))
			} else {
				writePluginDir(t, dir, a.files(t, true))
			}
			return f, err
		}
		err := w.load()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "files changed while being read")
		assert.Nil(t, w.current())
	})
	t.Run("invalid directory", func(t *testing.T) {
		w := NewPluginWatcher(t.TempDir(), tdPlugin, clocktesting.NewFakeClock(pluginT0), 0, nil)
		err := w.load()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "ca-cert.pem: open: no such file")
		assert.Equal(t, err, w.lastError())
		assert.Nil(t, w.current())
		assert.False(t, signalled(w.changes()))
	})
}

// TestPluginWatcherRun drives Run on synctest's fake time: the poll is
// observed without sleeping, and the bubble fails the test if Run is
// still running once the context is cancelled.
func TestPluginWatcherRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		dir := t.TempDir()
		a := newPluginPKI(t, pluginPKIOptions{now: now})
		writePluginDir(t, dir, a.files(t, true))
		w := NewPluginWatcher(dir, tdPlugin, clock.RealClock{}, 10*time.Second, nil)
		require.NoError(t, w.load())
		require.True(t, signalled(w.changes()))

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- w.run(ctx) }()

		b := newPluginPKI(t, pluginPKIOptions{now: now})
		writePluginDir(t, dir, b.files(t, true))
		time.Sleep(9 * time.Second)
		synctest.Wait()
		assert.False(t, signalled(w.changes()), "no poll before the interval")

		time.Sleep(time.Second)
		synctest.Wait()
		assert.True(t, signalled(w.changes()))
		assert.True(t, w.current().Cert.Equal(b.cert))

		cancel()
		assert.NoError(t, <-done)
	})
}

func TestNewPluginWatcherDefaults(t *testing.T) {
	w := NewPluginWatcher("/nonexistent", tdPlugin, nil, 0, nil)
	assert.Equal(t, DefaultPluginPollInterval, w.interval)
	assert.NotNil(t, w.clk)
	assert.NotNil(t, w.logger)
	assert.Nil(t, w.current())
	assert.NoError(t, w.lastError())
}
