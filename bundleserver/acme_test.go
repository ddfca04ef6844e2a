package bundleserver

import (
	"crypto/tls"
	"crypto/x509"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"github.com/miekg/dns"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/acme"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// acmeTestTimeout bounds each issuance in the tests; pebble on loopback
// with validation relaxed answers in a few seconds.
const acmeTestTimeout = 60 * time.Second

// pebbleServer is pebble, Let's Encrypt's ACME test server, run in the
// test process from its library packages on a loopback port.
type pebbleServer struct {
	dirURL       string
	roots        *x509.CertPool // trusts the directory's HTTPS certificate
	issuerRoots  *x509.CertPool // trusts the certificates pebble issues
	intermediate *x509.Certificate
}

// pebbleOptions choose how pebble validates challenges.
type pebbleOptions struct {
	// validateTLSPort, when set, makes pebble really validate: it resolves
	// every name to 127.0.0.1 through a DNS server on loopback and
	// connects to this port for TLS-ALPN-01. Otherwise the VA marks every
	// challenge valid without connecting anywhere.
	validateTLSPort int
}

// startPebble starts pebble with no random sleeps and no bad nonces,
// behind a certificate minted for 127.0.0.1.
func startPebble(t *testing.T, opts pebbleOptions) *pebbleServer {
	t.Helper()
	// Read by va.New and wfe.New.
	alwaysValid, resolver := "1", ""
	if opts.validateTLSPort != 0 {
		alwaysValid, resolver = "0", startLoopbackDNS(t)
	}
	t.Setenv("PEBBLE_VA_ALWAYS_VALID", alwaysValid)
	t.Setenv("PEBBLE_VA_NOSLEEP", "1")
	t.Setenv("PEBBLE_WFE_NONCEREJECT", "0")

	logs := &testlog.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pebble log:\n%s", logs.String())
		}
	})
	logger := log.New(logs, "pebble ", log.Lmicroseconds)

	store := db.NewMemoryStore()
	pca := ca.New(logger, store, "", "ecdsa", 0, 1, map[string]ca.Profile{"default": {Description: "default"}})
	// With validation relaxed the VA never connects and asks no resolver;
	// otherwise it resolves through the loopback DNS server and connects
	// to validateTLSPort only (HTTP-01 is not offered by autocert here).
	pva := va.New(logger, 1, opts.validateTLSPort, false, resolver, store)
	pwfe := wfe.New(logger, store, pva, pca, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)

	listenCA := testca.New(t, "pebble-listener.test")
	leaf, key := listenCA.Issue(t, spiffeid.RequireFromString("spiffe://pebble-listener.test/unused"), testca.Options{
		Mutate: func(c *x509.Certificate) {
			c.URIs = nil
			c.DNSNames = []string{"localhost"}
			c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		},
	})
	srv := httptest.NewUnstartedServer(pwfe.Handler())
	srv.TLS = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}},
	}
	srv.Config.ErrorLog = logger
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		stopPebbleVA(t, pva)
	})
	require.True(t, strings.HasPrefix(srv.URL, "https://127.0.0.1:"), "pebble must listen on loopback, got %s", srv.URL)

	roots := x509.NewCertPool()
	roots.AddCert(listenCA.Cert)
	issuerRoots := x509.NewCertPool()
	issuerRoots.AddCert(pca.GetRootCert(0).Cert)
	return &pebbleServer{
		dirURL:       srv.URL + wfe.DirectoryPath,
		roots:        roots,
		issuerRoots:  issuerRoots,
		intermediate: pca.GetIntermediateCert(0).Cert,
	}
}

// stopPebbleVA ends the task loop va.New starts, which pebble (a server
// meant to run until killed) gives no way to stop, so goleak sees no
// leftover goroutine. Run after the HTTP server is closed: nothing can
// queue a validation any more.
func stopPebbleVA(t *testing.T, v *va.VAImpl) {
	t.Helper()
	f := reflect.ValueOf(v).Elem().FieldByName("tasks")
	if !f.IsValid() || f.Kind() != reflect.Chan {
		t.Errorf("pebble's va.VAImpl has no tasks channel any more; update stopPebbleVA for this pebble version")
		return
	}
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Close()
}

// startLoopbackDNS serves DNS over TCP on loopback, answering every A
// query with 127.0.0.1 and every other query with no records, and returns
// its address.
func startLoopbackDNS(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	started := make(chan struct{})
	srv := &dns.Server{
		Listener:          ln,
		NotifyStartedFunc: func() { close(started) },
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			for _, q := range r.Question {
				if q.Qtype == dns.TypeA {
					m.Answer = append(m.Answer, &dns.A{
						Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET},
						A:   net.IPv4(127, 0, 0, 1),
					})
				}
			}
			_ = w.WriteMsg(m)
		}),
	}
	done := make(chan error, 1)
	go func() { done <- srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() {
		assert.NoError(t, srv.Shutdown())
		<-done
	})
	return ln.Addr().String()
}

// acmeHello is the ClientHello of a modern client: ECDSA-capable, so
// autocert orders its default P-256 certificate.
func acmeHello(name string) *tls.ClientHelloInfo {
	return &tls.ClientHelloInfo{
		ServerName:        name,
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256, tls.PSSWithSHA256},
		SupportedCurves:   []tls.CurveID{tls.X25519, tls.CurveP256},
		CipherSuites:      []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		SupportedVersions: []uint16{tls.VersionTLS13, tls.VersionTLS12},
	}
}

// getACMECert calls GetCertificate with a deadline: autocert's own is
// five minutes.
func getACMECert(t *testing.T, a *ACME, hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	t.Helper()
	type result struct {
		cert *tls.Certificate
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := a.GetCertificate(hello)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.cert, r.err
	case <-time.After(acmeTestTimeout):
		t.Fatalf("GetCertificate(%q) still running after %s", hello.ServerName, acmeTestTimeout)
		return nil, nil
	}
}

func newTestACME(t *testing.T, cfg ACMEConfig, logs *webCertLogs) *ACME {
	t.Helper()
	a, err := NewACME(cfg, slog.New(logs))
	require.NoError(t, err)
	t.Cleanup(a.httpClient.CloseIdleConnections)
	return a
}

func TestACMEWithPebble(t *testing.T) {
	p := startPebble(t, pebbleOptions{})
	cacheDir := filepath.Join(t.TempDir(), "data", "acme")
	logs := &webCertLogs{}
	cfg := ACMEConfig{
		Domains:      []string{webCertHost},
		Email:        "ops@example.test",
		DirectoryURL: p.dirURL,
		TOSAccepted:  true,
		CacheDir:     cacheDir,
		RootCAs:      p.roots,
	}
	a := newTestACME(t, cfg, logs)

	// First handshake: autocert registers, orders, answers TLS-ALPN-01
	// (which pebble marks valid) and finalizes.
	cert, err := getACMECert(t, a, acmeHello(webCertHost))
	require.NoError(t, err)
	require.NotNil(t, cert.Leaf)
	require.GreaterOrEqual(t, len(cert.Certificate), 2, "leaf and pebble's intermediate")
	assert.NoError(t, cert.Leaf.VerifyHostname(webCertHost))
	assert.Equal(t, p.intermediate.Raw, cert.Certificate[1], "issued by pebble's intermediate")
	assert.NoError(t, cert.Leaf.CheckSignatureFrom(p.intermediate))
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		inter.AddCert(c)
	}
	_, err = cert.Leaf.Verify(x509.VerifyOptions{DNSName: webCertHost, Roots: p.issuerRoots, Intermediates: inter})
	assert.NoError(t, err, "a Web PKI client trusting pebble's root accepts it")
	assert.Equal(t, 1, logs.count(slog.LevelInfo, "accepting the ACME CA's terms of service"))
	assert.Equal(t, 1, logs.count(slog.LevelInfo, "serving ACME certificate"))

	t.Run("second handshake is served from cache", func(t *testing.T) {
		again, err := getACMECert(t, a, acmeHello(webCertHost))
		require.NoError(t, err)
		assert.Equal(t, cert.Certificate, again.Certificate)
		assert.Equal(t, 1, logs.count(slog.LevelInfo, "serving ACME certificate"), "a certificate is announced once")
	})

	t.Run("cache directory is private", func(t *testing.T) {
		fi, err := os.Stat(cacheDir)
		require.NoError(t, err)
		assert.Equal(t, fs.FileMode(0o700), fi.Mode().Perm())
		var names []string
		require.NoError(t, filepath.WalkDir(cacheDir, func(path string, d fs.DirEntry, err error) error {
			require.NoError(t, err)
			if d.IsDir() {
				return nil
			}
			info, err := d.Info()
			require.NoError(t, err)
			assert.Equal(t, fs.FileMode(0o600), info.Mode().Perm(), "%s holds private keys", path)
			names = append(names, d.Name())
			return nil
		}))
		assert.Contains(t, names, "acme_account+key")
		assert.Contains(t, names, webCertHost)
	})

	t.Run("a restart serves the certificate from the cache directory", func(t *testing.T) {
		// Nothing listens at this directory: the certificate must come
		// from disk.
		offline := cfg
		offline.DirectoryURL = "https://127.0.0.1:1/dir"
		b := newTestACME(t, offline, &webCertLogs{})
		got, err := getACMECert(t, b, acmeHello(webCertHost))
		require.NoError(t, err)
		assert.Equal(t, cert.Certificate, got.Certificate)
	})

	t.Run("a real handshake", func(t *testing.T) {
		cc, sc := net.Pipe()
		defer cc.Close()
		defer sc.Close()
		errc := make(chan error, 1)
		go func() { errc <- tls.Server(sc, a.TLSConfig()).HandshakeContext(t.Context()) }()
		client := tls.Client(cc, &tls.Config{ServerName: webCertHost, RootCAs: p.issuerRoots, MinVersion: tls.VersionTLS12})
		require.NoError(t, client.HandshakeContext(t.Context()))
		require.NoError(t, <-errc)
		assert.Equal(t, cert.Certificate[0], client.ConnectionState().PeerCertificates[0].Raw)
	})

	t.Run("names not configured are refused", func(t *testing.T) {
		for _, name := range []string{"evil.example", "", "localhost", "127.0.0.1"} {
			_, err := getACMECert(t, a, acmeHello(name))
			assert.Error(t, err, "server name %q", name)
		}
		_, err := os.Stat(filepath.Join(cacheDir, "evil.example"))
		assert.ErrorIs(t, err, fs.ErrNotExist, "nothing ordered for it")
		assert.Zero(t, logs.count(slog.LevelError, ""), "scanners' names are not operator errors")
		assert.Equal(t, 4, logs.count(slog.LevelDebug, "refused TLS handshake"))
	})

	t.Run("unknown TLS-ALPN-01 challenge", func(t *testing.T) {
		hello := acmeHello(webCertHost)
		hello.SupportedProtos = []string{acme.ALPNProto}
		_, err := a.GetCertificate(hello)
		assert.Error(t, err, "no challenge is pending")
	})
}

// TestACMEWithPebbleValidating lets pebble really validate TLS-ALPN-01:
// it connects to a listener serving ACME.TLSConfig, on loopback, and
// checks the challenge certificate autocert serves for the acme-tls/1
// protocol. The same listener without that protocol fails validation.
func TestACMEWithPebbleValidating(t *testing.T) {
	for _, tt := range []struct {
		name     string
		withALPN bool
	}{{"TLSConfig", true}, {"NextProtos without acme-tls/1", false}} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			p := startPebble(t, pebbleOptions{validateTLSPort: ln.Addr().(*net.TCPAddr).Port})
			a := newTestACME(t, ACMEConfig{
				Domains:      []string{webCertHost},
				DirectoryURL: p.dirURL,
				TOSAccepted:  true,
				CacheDir:     filepath.Join(t.TempDir(), "acme"),
				RootCAs:      p.roots,
			}, &webCertLogs{})
			cfg := a.TLSConfig()
			if !tt.withALPN {
				cfg.NextProtos = []string{"h2", "http/1.1"}
			}

			var (
				wg         sync.WaitGroup
				challenges atomic.Int32
			)
			wg.Go(func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					wg.Go(func() {
						defer c.Close()
						tc := tls.Server(c, cfg)
						if tc.HandshakeContext(t.Context()) == nil && tc.ConnectionState().NegotiatedProtocol == acme.ALPNProto {
							challenges.Add(1)
						}
					})
				}
			})
			t.Cleanup(func() {
				ln.Close()
				wg.Wait()
			})

			cert, err := getACMECert(t, a, acmeHello(webCertHost))
			if !tt.withALPN {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "no viable challenge type found")
				assert.Zero(t, challenges.Load())
				return
			}
			require.NoError(t, err)
			assert.Positive(t, challenges.Load(), "pebble validated over TLS-ALPN-01")
			assert.Equal(t, p.intermediate.Raw, cert.Certificate[1])
		})
	}
}

// TestACMEIssuanceFailure checks failures for a configured name are
// logged once, with the server name, and the handshake fails.
func TestACMEIssuanceFailure(t *testing.T) {
	// A directory that refuses every request, over TLS on loopback. (A 5xx
	// would have autocert retry until its five-minute deadline.)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no ACME here", http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	logs := &webCertLogs{}
	a := newTestACME(t, ACMEConfig{
		Domains:      []string{webCertHost},
		DirectoryURL: srv.URL + "/dir",
		TOSAccepted:  true,
		CacheDir:     filepath.Join(t.TempDir(), "acme"),
		RootCAs:      roots,
	}, logs)

	_, err := getACMECert(t, a, acmeHello(webCertHost))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bundleserver: acme:")
	assert.Equal(t, 1, logs.count(slog.LevelError, "ACME certificate unavailable"))
	assert.Equal(t, webCertHost, logs.attr("ACME certificate unavailable", "server_name"))

	// Until autocert's retry delay passes, handshakes get "missing
	// certificate": logged once more, then quiet.
	for range 3 {
		_, err = getACMECert(t, a, acmeHello(webCertHost))
		require.Error(t, err)
	}
	assert.Equal(t, 2, logs.count(slog.LevelError, "ACME certificate unavailable"))
}

func TestNewACMERejectsBadConfig(t *testing.T) {
	valid := func(t *testing.T) ACMEConfig {
		return ACMEConfig{
			Domains:     []string{"bundle.example.org"},
			TOSAccepted: true,
			CacheDir:    filepath.Join(t.TempDir(), "acme"),
		}
	}
	tests := []struct {
		name    string
		mutate  func(*ACMEConfig)
		wantErr string
	}{
		{"no domains", func(c *ACMEConfig) { c.Domains = nil }, "at least one domain (--acme-domain) is required"},
		{"empty domain", func(c *ACMEConfig) { c.Domains = []string{""} }, `domain 1 (""): empty`},
		{"wildcard", func(c *ACMEConfig) { c.Domains = []string{"*.example.org"} }, "wildcards need the DNS-01 challenge"},
		{"IP address", func(c *ACMEConfig) { c.Domains = []string{"192.0.2.1"} }, "IP addresses are not supported"},
		{"IP address with a final dot", func(c *ACMEConfig) { c.Domains = []string{"192.0.2.1."} }, "IP addresses are not supported"},
		{"IPv6 address", func(c *ACMEConfig) { c.Domains = []string{"[2001:db8::1]"} }, "IP addresses are not supported"},
		{"URL", func(c *ACMEConfig) { c.Domains = []string{"https://example.org"} }, "want a bare host name"},
		{"port", func(c *ACMEConfig) { c.Domains = []string{"example.org:443"} }, "want a bare host name"},
		{"single label", func(c *ACMEConfig) { c.Domains = []string{"localhost"} }, "at least two labels"},
		{"underscore", func(c *ACMEConfig) { c.Domains = []string{"a.example.org", "foo_bar.example.org"} }, `domain 2 ("foo_bar.example.org"): not a valid host name`},
		{"empty label", func(c *ACMEConfig) { c.Domains = []string{"a..example.org"} }, `label "": want 1 to 63 characters`},
		{"leading hyphen", func(c *ACMEConfig) { c.Domains = []string{"-a.example.org"} }, "not a valid host name"},
		{"long label", func(c *ACMEConfig) { c.Domains = []string{strings.Repeat("a", 64) + ".example.org"} }, "want 1 to 63 characters"},
		{"long name", func(c *ACMEConfig) { c.Domains = []string{strings.Repeat("a.", 127) + "org"} }, "longer than 253 characters"},
		{"duplicate", func(c *ACMEConfig) { c.Domains = []string{"Bundle.Example.org", "bundle.example.org."} }, "same name as domain 1"},
		{"email with name", func(c *ACMEConfig) { c.Email = "Ops <ops@example.org>" }, "want a bare address"},
		{"email invalid", func(c *ACMEConfig) { c.Email = "ops" }, `email "ops"`},
		{"directory over http", func(c *ACMEConfig) { c.DirectoryURL = "http://acme.example.org/dir" }, "want an https URL"},
		{"directory with user info", func(c *ACMEConfig) { c.DirectoryURL = "https://u:p@acme.example.org/dir" }, "want an https URL"},
		{"terms not accepted", func(c *ACMEConfig) { c.TOSAccepted = false }, "pass --acme-tos-accepted"},
		{"no cache directory", func(c *ACMEConfig) { c.CacheDir = "" }, "a cache directory is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid(t)
			tt.mutate(&cfg)
			_, err := NewACME(cfg, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "bundleserver: acme: ")
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}

	t.Run("terms error names the directory", func(t *testing.T) {
		cfg := valid(t)
		cfg.TOSAccepted = false
		_, err := NewACME(cfg, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), acme.LetsEncryptURL)
	})

	t.Run("cache directory path is a file", func(t *testing.T) {
		cfg := valid(t)
		require.NoError(t, os.WriteFile(cfg.CacheDir, nil, 0o600))
		_, err := NewACME(cfg, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "cache directory "+cfg.CacheDir)
	})
}

func TestNewACMEDefaults(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "acme")
	require.NoError(t, os.Mkdir(dir, 0o755))
	logs := &webCertLogs{}
	a, err := NewACME(ACMEConfig{
		Domains:     []string{"Bundle.EXAMPLE.org.", "bücher.example"},
		TOSAccepted: true,
		CacheDir:    dir,
	}, slog.New(logs))
	require.NoError(t, err)

	assert.Equal(t, acme.LetsEncryptURL, a.mgr.Client.DirectoryURL)
	assert.Equal(t, map[string]bool{"bundle.example.org": true, "xn--bcher-kva.example": true}, a.domains)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "an existing directory is tightened")
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "changed its mode to 0700"))

	cfg := a.TLSConfig()
	assert.Contains(t, cfg.NextProtos, acme.ALPNProto, "TLS-ALPN-01 needs its protocol offered")
	assert.NotNil(t, cfg.GetCertificate)
	assert.GreaterOrEqual(t, cfg.MinVersion, uint16(tls.VersionTLS12))

	// Host policy: configured names pass in any case, others are refused
	// before any ACME traffic.
	assert.NoError(t, a.mgr.HostPolicy(t.Context(), "bundle.example.org"))
	assert.NoError(t, a.mgr.HostPolicy(t.Context(), "xn--bcher-kva.example"))
	assert.Error(t, a.mgr.HostPolicy(t.Context(), "evil.example"))

	// HTTP-01: challenge paths are answered (here: no such token), others
	// reach the fallback.
	h := a.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://bundle.example.org/", nil))
	assert.Equal(t, http.StatusTeapot, rec.Code)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://bundle.example.org/.well-known/acme-challenge/x", nil))
	assert.Equal(t, http.StatusNotFound, rec.Code)
}

func TestACMERenewalOverdue(t *testing.T) {
	nb := time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)
	leaf := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(90 * 24 * time.Hour)}
	short := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(6 * 24 * time.Hour)}
	tests := []struct {
		name string
		leaf *x509.Certificate
		now  time.Time
		want string
	}{
		{"fresh", leaf, nb.Add(time.Hour), ""},
		{"renewal window open", leaf, leaf.NotAfter.Add(-29 * 24 * time.Hour), ""},
		{"halfway through the window", leaf, leaf.NotAfter.Add(-15*24*time.Hour + time.Minute), "certificate renewal is overdue"},
		{"expired", leaf, leaf.NotAfter.Add(time.Second), "certificate expired and was not renewed"},
		{"short-lived, window open", short, short.NotAfter.Add(-47 * time.Hour), ""},
		{"short-lived, overdue", short, short.NotAfter.Add(-23 * time.Hour), "certificate renewal is overdue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, renewalOverdue(tt.leaf, tt.now))
		})
	}
}

func TestACMEObserveLogsOverdueOnce(t *testing.T) {
	logs := &webCertLogs{}
	a, err := NewACME(ACMEConfig{Domains: []string{webCertHost}, TOSAccepted: true, CacheDir: filepath.Join(t.TempDir(), "acme")}, slog.New(logs))
	require.NoError(t, err)
	ca := newWebCA(t)
	p := newWebCertPair(t, ca, webCertT0)
	cert := &tls.Certificate{Certificate: [][]byte{p.leaf.Raw}, Leaf: p.leaf}

	now := p.leaf.NotAfter.Add(-10 * 24 * time.Hour)
	a.now = func() time.Time { return now }
	a.observe(webCertHost, cert)
	a.observe(webCertHost, cert)
	assert.Equal(t, 1, logs.count(slog.LevelError, "certificate renewal is overdue"))

	now = p.leaf.NotAfter.Add(time.Minute)
	a.observe(webCertHost, cert)
	a.observe(webCertHost, cert)
	assert.Equal(t, 1, logs.count(slog.LevelError, "certificate expired and was not renewed"))
	assert.Equal(t, 1, logs.count(slog.LevelInfo, "serving ACME certificate"))
}

// FuzzNormalizeACMEDomain checks that every accepted name is a lower-case
// LDH host name that normalizes to itself, the way autocert maps the SNI
// of a handshake, so the host policy and the log classification agree.
func FuzzNormalizeACMEDomain(f *testing.F) {
	for _, s := range []string{"bundle.example.org", "Bundle.Example.ORG.", "bücher.example", "xn--bcher-kva.example", "*.example.org", "a..b", "-a.b", "127.0.0.1", "[::1]", "a_b.c", "ä.ß.σ", "", "\xed.0", "0.0.0.0."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := normalizeACMEDomain(in)
		if err != nil {
			return
		}
		if len(out) > 253 || !strings.Contains(out, ".") {
			t.Fatalf("%q → %q: bad shape", in, out)
		}
		for _, l := range strings.Split(out, ".") {
			if err := checkDNSLabel(l); err != nil {
				t.Fatalf("%q → %q: %v", in, out, err)
			}
		}
		if again, err := normalizeACMEDomain(out); err != nil || again != out {
			t.Fatalf("%q → %q → %q, %v: not idempotent", in, out, again, err)
		}
		if got := normalizeSNI(out); got != out {
			t.Fatalf("%q → %q, but as an SNI → %q", in, out, got)
		}
	})
}
