package bundleserver

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
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

const webCertHost = "bundle.example.test"

var webCertT0 = time.Date(2030, time.March, 1, 12, 0, 0, 0, time.UTC)

// webCertPair is a server certificate as an operator would mount it.
type webCertPair struct {
	leaf    *x509.Certificate
	certPEM []byte // leaf, then the issuing CA
	keyPEM  []byte
}

// newWebCertPair mints a Web PKI style leaf for webCertHost, valid from
// notBefore for 90 days, issued by ca.
func newWebCertPair(t testing.TB, ca *testca.CA, notBefore time.Time, mutate ...func(*x509.Certificate)) webCertPair {
	t.Helper()
	leaf, key := ca.Issue(t, spiffeid.RequireFromString("spiffe://"+ca.TrustDomain.Name()+"/unused"), testca.Options{
		NotBefore: notBefore,
		NotAfter:  notBefore.Add(90 * 24 * time.Hour),
		Mutate: func(c *x509.Certificate) {
			c.URIs = nil
			c.DNSNames = []string{webCertHost}
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			for _, m := range mutate {
				m(c)
			}
		},
	})
	return webCertPair{leaf: leaf, certPEM: webCertPEM(leaf, ca.Cert), keyPEM: webKeyPEM(t, key)}
}

func newWebCA(t *testing.T) *testca.CA {
	t.Helper()
	return testca.New(t, "web-ca.test", testca.Options{
		NotBefore: webCertT0.Add(-365 * 24 * time.Hour),
		NotAfter:  webCertT0.Add(10 * 365 * 24 * time.Hour),
	})
}

func webCertPEM(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

func webKeyPEM(t testing.TB, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// webCertFixture is a FileCertificate on files in a temporary directory,
// at a fake time, with its logs recorded.
type webCertFixture struct {
	certPath, keyPath string
	clk               *clocktesting.FakePassiveClock
	logs              *webCertLogs
	fc                *FileCertificate
}

func newWebCertFixture(t *testing.T) *webCertFixture {
	t.Helper()
	dir := t.TempDir()
	fx := &webCertFixture{
		certPath: filepath.Join(dir, "tls.crt"),
		keyPath:  filepath.Join(dir, "tls.key"),
		clk:      clocktesting.NewFakePassiveClock(webCertT0),
		logs:     &webCertLogs{},
	}
	fx.fc = NewFileCertificate(fx.certPath, fx.keyPath, fx.clk, slog.New(fx.logs))
	return fx
}

func (fx *webCertFixture) writeCert(t *testing.T, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(fx.certPath, data, 0o600))
}

func (fx *webCertFixture) writeKey(t *testing.T, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(fx.keyPath, data, 0o600))
}

func (fx *webCertFixture) write(t *testing.T, p webCertPair) {
	t.Helper()
	fx.writeCert(t, p.certPEM)
	fx.writeKey(t, p.keyPEM)
}

// serving returns the leaf GetCertificate currently serves.
func (fx *webCertFixture) serving(t *testing.T) *x509.Certificate {
	t.Helper()
	c, err := fx.fc.GetCertificate(&tls.ClientHelloInfo{ServerName: webCertHost})
	require.NoError(t, err)
	require.NotNil(t, c.Leaf)
	return c.Leaf
}

// webCertLogs records log records for assertions.
type webCertLogs struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *webCertLogs) Enabled(context.Context, slog.Level) bool { return true }
func (l *webCertLogs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *webCertLogs) WithGroup(string) slog.Handler            { return l }
func (l *webCertLogs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// count returns how many records at level have a message containing msg.
func (l *webCertLogs) count(level slog.Level, msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

// attr returns the value of key in the last record whose message
// contains msg.
func (l *webCertLogs) attr(msg, key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := ""
	for _, r := range l.records {
		if strings.Contains(r.Message, msg) {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == key {
					v = a.Value.String()
				}
				return true
			})
		}
	}
	return v
}

func TestFileCertificateLoad(t *testing.T) {
	ca := newWebCA(t)
	good := newWebCertPair(t, ca, webCertT0.Add(-time.Hour))

	t.Run("valid", func(t *testing.T) {
		fx := newWebCertFixture(t)
		_, err := fx.fc.GetCertificate(&tls.ClientHelloInfo{})
		require.Error(t, err, "nothing to serve before Load")

		fx.write(t, good)
		require.NoError(t, fx.fc.Load())
		assert.NoError(t, fx.fc.LastError())
		assert.True(t, fx.serving(t).Equal(good.leaf))
		c, err := fx.fc.GetCertificate(&tls.ClientHelloInfo{})
		require.NoError(t, err)
		assert.Len(t, c.Certificate, 2, "the chain is served as given")
		assert.Equal(t, 1, fx.logs.count(slog.LevelInfo, "web certificate loaded"))
		assert.Zero(t, fx.logs.count(slog.LevelWarn, ""), "a 0600 key and a long-lived leaf draw no warning")
	})

	other := newWebCertPair(t, ca, webCertT0.Add(-time.Hour))
	expired := newWebCertPair(t, ca, webCertT0.Add(-91*24*time.Hour))
	early := newWebCertPair(t, ca, webCertT0.Add(time.Hour))
	clientOnly := newWebCertPair(t, ca, webCertT0.Add(-time.Hour), func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	big := append([]byte("# padding\n"), make([]byte, maxWebCertFileSize)...)
	tests := []struct {
		name     string
		cert     []byte
		key      []byte
		noCert   bool
		noKey    bool
		wantErrs []string
	}{
		{name: "missing certificate file", noCert: true, key: good.keyPEM, wantErrs: []string{"certificate file", "no such file"}},
		{name: "missing key file", cert: good.certPEM, noKey: true, wantErrs: []string{"key file", "no such file"}},
		{name: "not PEM", cert: []byte("hello"), key: good.keyPEM, wantErrs: []string{"failed to find any PEM data in certificate input"}},
		{name: "key in the certificate file", cert: good.keyPEM, key: good.keyPEM, wantErrs: []string{"private key"}},
		{name: "key of another certificate", cert: good.certPEM, key: other.keyPEM, wantErrs: []string{"private key does not match the certificate"}},
		{name: "certificate file over 1 MiB", cert: big, key: good.keyPEM, wantErrs: []string{"larger than 1048576 bytes"}},
		{name: "expired", cert: expired.certPEM, key: expired.keyPEM, wantErrs: []string{"certificate expired at 2030-02-28T12:00:00Z"}},
		{name: "not yet valid", cert: early.certPEM, key: early.keyPEM, wantErrs: []string{"certificate is not valid until 2030-03-01T13:00:00Z"}},
		{
			name:     "CA certificate",
			cert:     webCertPEM(ca.Cert),
			key:      webKeyPEM(t, ca.Key),
			wantErrs: []string{"is a CA certificate", "must be the server's leaf"},
		},
		{name: "client-only certificate", cert: clientOnly.certPEM, key: clientOnly.keyPEM, wantErrs: []string{"does not allow TLS server authentication"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newWebCertFixture(t)
			if !tt.noCert {
				fx.writeCert(t, tt.cert)
			}
			if !tt.noKey {
				fx.writeKey(t, tt.key)
			}
			err := fx.fc.Load()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "bundleserver: web certificate (cert "+fx.certPath)
			for _, want := range tt.wantErrs {
				assert.Contains(t, err.Error(), want)
			}
			assert.Equal(t, err, fx.fc.LastError())
			_, err = fx.fc.GetCertificate(&tls.ClientHelloInfo{})
			assert.Error(t, err, "a refused pair is never served")
		})
	}
}

func TestFileCertificateReload(t *testing.T) {
	ca := newWebCA(t)
	a := newWebCertPair(t, ca, webCertT0.Add(-time.Hour))
	b := newWebCertPair(t, ca, webCertT0.Add(-time.Minute))

	fx := newWebCertFixture(t)
	fx.write(t, a)
	require.NoError(t, fx.fc.Load())

	assert.NoError(t, fx.fc.Check(), "unchanged files")
	assert.True(t, fx.serving(t).Equal(a.leaf))
	assert.Equal(t, 1, fx.logs.count(slog.LevelInfo, "web certificate loaded"), "unchanged files are not reloaded")

	fx.write(t, b)
	require.NoError(t, fx.fc.Check())
	assert.True(t, fx.serving(t).Equal(b.leaf))
	assert.NoError(t, fx.fc.LastError())
	assert.Equal(t, 2, fx.logs.count(slog.LevelInfo, "web certificate loaded"))
}

// TestFileCertificateRotationOverTLS checks a handshake after a reload
// gets the new certificate without touching the listener's config.
func TestFileCertificateRotationOverTLS(t *testing.T) {
	ca := testca.New(t, "web-ca.test")
	a := newWebCertPair(t, ca, time.Now().Add(-time.Hour))
	b := newWebCertPair(t, ca, time.Now().Add(-time.Minute))
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(p webCertPair) {
		require.NoError(t, os.WriteFile(certPath, p.certPEM, 0o600))
		require.NoError(t, os.WriteFile(keyPath, p.keyPEM, 0o600))
	}
	write(a)
	fc := NewFileCertificate(certPath, keyPath, clock.RealClock{}, nil)
	require.NoError(t, fc.Load())
	serverConfig := &tls.Config{GetCertificate: fc.GetCertificate, MinVersion: tls.VersionTLS12}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	handshake := func() *x509.Certificate {
		t.Helper()
		cc, sc := net.Pipe()
		defer cc.Close()
		defer sc.Close()
		errc := make(chan error, 1)
		go func() { errc <- tls.Server(sc, serverConfig).HandshakeContext(t.Context()) }()
		client := tls.Client(cc, &tls.Config{ServerName: webCertHost, RootCAs: roots, MinVersion: tls.VersionTLS12})
		require.NoError(t, client.HandshakeContext(t.Context()))
		require.NoError(t, <-errc)
		return client.ConnectionState().PeerCertificates[0]
	}
	assert.True(t, handshake().Equal(a.leaf))
	write(b)
	require.NoError(t, fc.Check())
	assert.True(t, handshake().Equal(b.leaf))
}

func TestFileCertificateBadChangeKeepsLastGood(t *testing.T) {
	ca := newWebCA(t)
	good := newWebCertPair(t, ca, webCertT0.Add(-time.Hour))
	next := newWebCertPair(t, ca, webCertT0.Add(-time.Minute))

	tests := []struct {
		name    string
		change  func(t *testing.T, fx *webCertFixture)
		wantErr string
	}{
		{
			name:    "garbage certificate",
			change:  func(t *testing.T, fx *webCertFixture) { fx.writeCert(t, []byte("-----BEGIN CERTIFICATE-----\nnope\n")) },
			wantErr: "failed to find",
		},
		{
			name: "CA certificate",
			change: func(t *testing.T, fx *webCertFixture) {
				fx.writeCert(t, webCertPEM(ca.Cert))
				fx.writeKey(t, webKeyPEM(t, ca.Key))
			},
			wantErr: "is a CA certificate",
		},
		{
			name: "expired certificate",
			change: func(t *testing.T, fx *webCertFixture) {
				old := newWebCertPair(t, ca, webCertT0.Add(-100*24*time.Hour))
				fx.write(t, old)
			},
			wantErr: "certificate expired at",
		},
		{
			name:    "key file removed",
			change:  func(t *testing.T, fx *webCertFixture) { require.NoError(t, os.Remove(fx.keyPath)) },
			wantErr: "key file",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newWebCertFixture(t)
			fx.write(t, good)
			require.NoError(t, fx.fc.Load())

			tt.change(t, fx)
			err := fx.fc.Check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.Equal(t, err, fx.fc.LastError())
			assert.True(t, fx.serving(t).Equal(good.leaf), "last good certificate still served")

			// The same problem at the next check is returned again but
			// logged once.
			require.Error(t, fx.fc.Check())
			assert.Equal(t, 1, fx.logs.count(slog.LevelError, "web certificate invalid"))

			fx.write(t, next)
			require.NoError(t, fx.fc.Check())
			assert.NoError(t, fx.fc.LastError())
			assert.True(t, fx.serving(t).Equal(next.leaf))
		})
	}

	t.Run("restoring the served files clears the error", func(t *testing.T) {
		fx := newWebCertFixture(t)
		fx.write(t, good)
		require.NoError(t, fx.fc.Load())
		fx.writeCert(t, []byte("junk"))
		require.Error(t, fx.fc.Check())
		fx.write(t, good)
		require.NoError(t, fx.fc.Check())
		assert.NoError(t, fx.fc.LastError())
	})
}

func TestFileCertificateHalfUpdatedPair(t *testing.T) {
	ca := newWebCA(t)
	a := newWebCertPair(t, ca, webCertT0.Add(-time.Hour))
	b := newWebCertPair(t, ca, webCertT0.Add(-time.Minute))

	t.Run("writer finishes by the next check", func(t *testing.T) {
		fx := newWebCertFixture(t)
		fx.write(t, a)
		require.NoError(t, fx.fc.Load())

		fx.writeCert(t, b.certPEM) // the key is still a's
		require.NoError(t, fx.fc.Check(), "one mismatch is a writer mid-update")
		assert.NoError(t, fx.fc.LastError())
		assert.True(t, fx.serving(t).Equal(a.leaf))
		assert.Zero(t, fx.logs.count(slog.LevelError, ""))

		fx.writeKey(t, b.keyPEM)
		require.NoError(t, fx.fc.Check())
		assert.True(t, fx.serving(t).Equal(b.leaf))
	})

	t.Run("mismatch that persists is an error", func(t *testing.T) {
		fx := newWebCertFixture(t)
		fx.write(t, a)
		require.NoError(t, fx.fc.Load())

		fx.writeCert(t, b.certPEM)
		require.NoError(t, fx.fc.Check())
		err := fx.fc.Check()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "private key does not match the certificate")
		assert.Equal(t, err, fx.fc.LastError())
		assert.True(t, fx.serving(t).Equal(a.leaf))
		assert.Equal(t, 1, fx.logs.count(slog.LevelError, "web certificate invalid"))

		require.Error(t, fx.fc.Check(), "still mismatched, still an error")
	})

	t.Run("a good check in between resets the count", func(t *testing.T) {
		fx := newWebCertFixture(t)
		fx.write(t, a)
		require.NoError(t, fx.fc.Load())

		fx.writeCert(t, b.certPEM)
		require.NoError(t, fx.fc.Check())
		fx.writeCert(t, a.certPEM) // back to the served pair
		require.NoError(t, fx.fc.Check())
		fx.writeCert(t, b.certPEM)
		require.NoError(t, fx.fc.Check())
	})

	t.Run("files changing between reads", func(t *testing.T) {
		fx := newWebCertFixture(t)
		fx.write(t, a)
		require.NoError(t, fx.fc.Load())

		// The key is already b's when the certificate is read; the writer
		// replaces the certificate right after our first read.
		fx.writeKey(t, b.keyPEM)
		reads := 0
		real := fx.fc.read
		fx.fc.read = func() (*webCertFiles, error) {
			reads++
			files, err := real()
			if reads == 1 {
				fx.writeCert(t, b.certPEM)
			}
			return files, err
		}
		require.NoError(t, fx.fc.Check(), "caught mid-update: try again next interval")
		assert.True(t, fx.serving(t).Equal(a.leaf))
		assert.NoError(t, fx.fc.LastError())

		require.NoError(t, fx.fc.Check())
		assert.True(t, fx.serving(t).Equal(b.leaf))
	})

	t.Run("Load re-reads a pair caught mid-update", func(t *testing.T) {
		fx := newWebCertFixture(t)
		fx.write(t, a)
		reads := 0
		real := fx.fc.read
		fx.fc.read = func() (*webCertFiles, error) {
			reads++
			if reads == 2 {
				fx.write(t, b)
			}
			return real()
		}
		require.NoError(t, fx.fc.Load())
		assert.True(t, fx.serving(t).Equal(b.leaf))
		assert.Equal(t, 4, reads)
	})

	t.Run("Load gives up on files that never settle", func(t *testing.T) {
		fx := newWebCertFixture(t)
		fx.write(t, a)
		n := 0
		real := fx.fc.read
		fx.fc.read = func() (*webCertFiles, error) {
			n++
			if n%2 == 0 {
				fx.write(t, []webCertPair{a, b}[n/2%2])
			}
			return real()
		}
		err := fx.fc.Load()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "files changed while being read")
	})
}

func TestFileCertificateTime(t *testing.T) {
	ca := newWebCA(t)
	p := newWebCertPair(t, ca, webCertT0.Add(-time.Hour)) // expires webCertT0 + 90d - 1h

	fx := newWebCertFixture(t)
	fx.write(t, p)
	require.NoError(t, fx.fc.Load())
	assert.Zero(t, fx.logs.count(slog.LevelWarn, "expires soon"))

	fx.clk.SetTime(p.leaf.NotAfter.Add(-6 * 24 * time.Hour))
	require.NoError(t, fx.fc.Check())
	require.NoError(t, fx.fc.Check())
	assert.Equal(t, 1, fx.logs.count(slog.LevelWarn, "expires soon"), "warned once per certificate")

	// Expired and not replaced: still served (nothing better exists), but
	// reported.
	fx.clk.SetTime(p.leaf.NotAfter.Add(time.Second))
	err := fx.fc.Check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "certificate expired at")
	assert.Equal(t, err, fx.fc.LastError())
	assert.True(t, fx.serving(t).Equal(p.leaf))

	// A soon-expiring replacement loads, with a warning of its own.
	q := newWebCertPair(t, ca, p.leaf.NotAfter.Add(-85*24*time.Hour))
	fx.write(t, q)
	require.NoError(t, fx.fc.Check())
	assert.True(t, fx.serving(t).Equal(q.leaf))
	assert.Equal(t, 2, fx.logs.count(slog.LevelWarn, "expires soon"))
}

func TestFileCertificateWarnings(t *testing.T) {
	ca := newWebCA(t)
	p := newWebCertPair(t, ca, webCertT0.Add(-time.Hour))

	t.Run("readable key file", func(t *testing.T) {
		if runtime.GOOS == "windows" {
			t.Skip("no Unix file modes")
		}
		fx := newWebCertFixture(t)
		fx.write(t, p)
		require.NoError(t, os.Chmod(fx.keyPath, 0o644))
		require.NoError(t, fx.fc.Load())
		assert.Contains(t, fx.logs.attr("loaded with a warning", "warning"), "private key file mode 0644")
	})

	t.Run("chain out of order and no SAN", func(t *testing.T) {
		other := newWebCA(t)
		np := newWebCertPair(t, ca, webCertT0.Add(-time.Hour), func(c *x509.Certificate) { c.DNSNames = nil })
		fx := newWebCertFixture(t)
		fx.writeCert(t, append(webCertPEM(np.leaf), webCertPEM(other.Cert)...))
		fx.writeKey(t, np.keyPEM)
		require.NoError(t, fx.fc.Load())
		assert.Equal(t, 2, fx.logs.count(slog.LevelWarn, "loaded with a warning"))
	})
}

// TestFileCertificateRun drives Run on synctest's fake time: the poll is
// observed without sleeping, and the bubble fails the test if Run is
// still running once the context is cancelled.
func TestFileCertificateRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := testca.New(t, "web-ca.test")
		a := newWebCertPair(t, ca, time.Now().Add(-time.Hour))
		b := newWebCertPair(t, ca, time.Now().Add(-time.Minute))
		dir := t.TempDir()
		certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		require.NoError(t, os.WriteFile(certPath, a.certPEM, 0o600))
		require.NoError(t, os.WriteFile(keyPath, a.keyPEM, 0o600))
		fc := NewFileCertificate(certPath, keyPath, nil, nil)
		require.NoError(t, fc.Load())

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- fc.Run(ctx, 10*time.Second) }()

		require.NoError(t, os.WriteFile(certPath, b.certPEM, 0o600))
		require.NoError(t, os.WriteFile(keyPath, b.keyPEM, 0o600))
		time.Sleep(9 * time.Second)
		synctest.Wait()
		c, err := fc.GetCertificate(nil)
		require.NoError(t, err)
		assert.True(t, c.Leaf.Equal(a.leaf), "no poll before the interval")

		time.Sleep(time.Second)
		synctest.Wait()
		c, err = fc.GetCertificate(nil)
		require.NoError(t, err)
		assert.True(t, c.Leaf.Equal(b.leaf))

		cancel()
		assert.NoError(t, <-done)
	})
}

// FuzzParseWebCert feeds arbitrary certificate and key files to the
// parser: it must not panic, and whatever it accepts is a server leaf
// whose key is the one given.
func FuzzParseWebCert(f *testing.F) {
	ca := testca.New(f, "web-ca.test")
	a := newWebCertPair(f, ca, time.Now().Add(-time.Hour))
	b := newWebCertPair(f, ca, time.Now().Add(-time.Hour))
	f.Add(a.certPEM, a.keyPEM)
	f.Add(a.certPEM, b.keyPEM)
	f.Add(webCertPEM(ca.Cert), webKeyPEM(f, ca.Key))
	f.Add(a.keyPEM, a.certPEM)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, certPEM, keyPEM []byte) {
		cert, _, err := parseWebCert(&webCertFiles{cert: certPEM, key: keyPEM, keyMode: 0o600})
		if err != nil {
			return
		}
		if cert.Leaf == nil || cert.Leaf.IsCA {
			t.Fatalf("accepted leaf %v", cert.Leaf)
		}
		pub, ok := cert.Leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
		if !ok || !pub.Equal(cert.PrivateKey.(crypto.Signer).Public()) {
			t.Fatal("accepted a key that is not the leaf's")
		}
	})
}
