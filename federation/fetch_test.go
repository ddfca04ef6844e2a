package federation

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	gofed "github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

const (
	fetchTD       = "example.org"
	fetchServerID = "spiffe://example.org/bundle-server"
)

// fetchFixture is a trust domain with a CA, the bundle it publishes, and
// the roots a Fetcher uses to authenticate its https_spiffe server.
type fetchFixture struct {
	ca     *testca.CA
	bundle *spiffebundle.Bundle
	doc    []byte
}

func newFetchFixture(t *testing.T) *fetchFixture {
	t.Helper()
	ca := testca.New(t, fetchTD)
	b := ca.Bundle()
	b.SetSequenceNumber(7)
	b.SetRefreshHint(5 * time.Minute)
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	return &fetchFixture{ca: ca, bundle: b, doc: doc}
}

// roots serves the fixture CA for its own trust domain only.
func (fx *fetchFixture) roots() BundleSource {
	return BundleSourceFunc(func(d spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
		if d != fx.ca.TrustDomain {
			return nil, false
		}
		return x509bundle.FromX509Authorities(d, []*x509.Certificate{fx.ca.Cert}), true
	})
}

// svidCert mints a TLS certificate carrying an X509-SVID for sid from ca.
func svidCert(t *testing.T, ca *testca.CA, sid string, opts ...testca.Options) tls.Certificate {
	t.Helper()
	leaf, key := ca.Issue(t, id(sid), opts...)
	return tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// startTLS starts a loopback TLS server presenting cert (httptest's own
// 127.0.0.1 certificate when cert is nil).
func startTLS(t *testing.T, h http.Handler, cert *tls.Certificate) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	// Refused handshakes are the point of most tests; keep them out of
	// the output.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if cert != nil {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func serveDoc(doc []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	}
}

func spiffeEndpoint(t *testing.T, u string) Endpoint {
	return spiffe(t, fetchTD, u, fetchServerID)
}

func (fx *fetchFixture) fetcher(cfg FetcherConfig) *Fetcher {
	if cfg.Roots == nil {
		cfg.Roots = fx.roots()
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	return NewFetcher(cfg)
}

func TestFetchSPIFFE(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	cert := svidCert(t, fx.ca, fetchServerID)
	var gotAccept string
	srv := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAccept = r.Header.Get("Accept")
		w.Header().Set("ETag", `"v7"`)
		serveDoc(fx.doc)(w, r)
	}), &cert)

	res, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, srv.URL+"/bundle"), "")
	require.NoError(t, err)
	assert.False(t, res.NotModified)
	assert.Equal(t, `"v7"`, res.ETag)
	assert.Equal(t, fx.doc, res.Raw)
	assert.Empty(t, res.Warnings)
	require.NotNil(t, res.Bundle)
	assert.Equal(t, td(fetchTD), res.Bundle.TrustDomain())
	assert.True(t, res.Bundle.Equal(fx.bundle), "fetched bundle differs from the served one")
	assert.Equal(t, "application/json", gotAccept)
}

func TestFetchWebPrivateCA(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	srv := startTLS(t, serveDoc(fx.doc), nil)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	ep := web(t, fetchTD, srv.URL)

	res, err := fx.fetcher(FetcherConfig{AllowPrivate: true, WebRoots: pool}).Fetch(t.Context(), ep, "")
	require.NoError(t, err)
	assert.True(t, res.Bundle.Equal(fx.bundle))

	// Without the private CA the system pool does not know the server.
	_, err = fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), ep, "")
	assert.ErrorIs(t, err, ErrTLS)
	assert.Equal(t, "tls", FetchErrorKind(err))
}

func TestFetchNeverFallsBackBetweenProfiles(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)

	// https_spiffe against a Web PKI server: refused even though the web
	// certificate is valid for the host and trusted.
	webSrv := startTLS(t, serveDoc(fx.doc), nil)
	pool := x509.NewCertPool()
	pool.AddCert(webSrv.Certificate())
	_, err := fx.fetcher(FetcherConfig{AllowPrivate: true, WebRoots: pool}).Fetch(t.Context(), spiffeEndpoint(t, webSrv.URL), "")
	assert.ErrorIs(t, err, ErrTLS)
	assert.ErrorIs(t, err, ErrProfileMismatch, "a Web PKI certificate where an SVID belongs: what a falling-back client would accept")
	assert.Equal(t, "profile_mismatch", FetchErrorKind(err))

	// https_web against an SVID server: the SVID has no DNS/IP SAN and the
	// SPIFFE CA is not a Web root.
	cert := svidCert(t, fx.ca, fetchServerID)
	svidSrv := startTLS(t, serveDoc(fx.doc), &cert)
	spiffePool := x509.NewCertPool()
	spiffePool.AddCert(fx.ca.Cert)
	_, err = fx.fetcher(FetcherConfig{AllowPrivate: true, WebRoots: spiffePool}).Fetch(t.Context(), web(t, fetchTD, svidSrv.URL), "")
	assert.ErrorIs(t, err, ErrTLS)
	assert.ErrorIs(t, err, ErrProfileMismatch)
	assert.Equal(t, "profile_mismatch", FetchErrorKind(err))

	// An SVID for the wrong ID is a plain authentication failure, not the
	// other profile.
	other := svidCert(t, fx.ca, "spiffe://"+fetchTD+"/someone-else")
	otherSrv := startTLS(t, serveDoc(fx.doc), &other)
	_, err = fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, otherSrv.URL), "")
	assert.ErrorIs(t, err, ErrTLS)
	assert.NotErrorIs(t, err, ErrProfileMismatch)
}

func TestFetchNotModified(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	cert := svidCert(t, fx.ca, fetchServerID)
	srv := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v7"`)
		if r.Header.Get("If-None-Match") == `"v7"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		serveDoc(fx.doc)(w, r)
	}), &cert)
	f := fx.fetcher(FetcherConfig{AllowPrivate: true})
	ep := spiffeEndpoint(t, srv.URL)

	res, err := f.Fetch(t.Context(), ep, "")
	require.NoError(t, err)
	require.False(t, res.NotModified)

	res, err = f.Fetch(t.Context(), ep, res.ETag)
	require.NoError(t, err)
	assert.True(t, res.NotModified)
	assert.Nil(t, res.Bundle)
	assert.Equal(t, `"v7"`, res.ETag)

	res, err = f.Fetch(t.Context(), ep, `"v6"`)
	require.NoError(t, err)
	assert.False(t, res.NotModified)
}

func TestFetchUnaskedNotModifiedIsAnError(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	cert := svidCert(t, fx.ca, fetchServerID)
	srv := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotModified)
	}), &cert)
	_, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, srv.URL), "")
	assert.ErrorIs(t, err, ErrStatus)
}

// TestFetchFaults is the fault matrix: each case is one way an endpoint can
// misbehave, and each must fail with the right kind.
func TestFetchFaults(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	good := svidCert(t, fx.ca, fetchServerID)
	other := testca.New(t, "other.org")

	type setup struct {
		url string
		ep  func(url string) Endpoint
		cfg FetcherConfig
		// engaged, for a fault that holds the request open, is signalled
		// once the fetch has reached it: the fetch then waits for its
		// deadline, which the test passes.
		engaged <-chan struct{}
	}
	spiffeSrv := func(t *testing.T, h http.Handler) setup {
		return setup{url: startTLS(t, h, &good).URL}
	}
	tests := []struct {
		name     string
		setup    func(t *testing.T) setup
		wantErr  error
		wantKind string
		wantMsg  string
	}{
		{
			name: "refused connection",
			setup: func(t *testing.T) setup {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				addr := l.Addr().String()
				require.NoError(t, l.Close())
				return setup{url: "https://" + addr}
			},
			wantKind: "transport",
			wantMsg:  "refused",
		},
		{
			name: "blackhole",
			setup: func(t *testing.T) setup {
				addr, engaged := engagedBlackhole(t)
				return setup{url: "https://" + addr, cfg: FetcherConfig{Timeout: 300 * time.Millisecond}, engaged: engaged}
			},
			wantErr:  context.DeadlineExceeded,
			wantKind: "timeout",
		},
		{
			name: "one byte per second",
			setup: func(t *testing.T) setup {
				engaged := make(chan struct{}, 1)
				s := spiffeSrv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					tick := time.NewTicker(time.Second)
					defer tick.Stop()
					for i, c := range fx.doc {
						_, _ = w.Write([]byte{c})
						w.(http.Flusher).Flush()
						if i == 0 {
							notifyNonBlocking(engaged)
						}
						select {
						case <-r.Context().Done():
							return
						case <-tick.C:
						}
					}
				}))
				s.cfg.Timeout = 300 * time.Millisecond
				s.engaged = engaged
				return s
			},
			wantErr:  context.DeadlineExceeded,
			wantKind: "timeout",
		},
		{
			name: "oversized body",
			setup: func(t *testing.T) setup {
				s := spiffeSrv(t, serveDoc([]byte(`{"keys":[],"pad":"`+strings.Repeat("x", 4096)+`"}`)))
				s.cfg.MaxSize = 1024
				return s
			},
			wantErr:  ErrTooLarge,
			wantKind: "too_large",
		},
		{
			name: "HTTP 500 with a valid bundle body",
			setup: func(t *testing.T) setup {
				return spiffeSrv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = w.Write(fx.doc)
				}))
			},
			wantErr:  ErrStatus,
			wantKind: "status",
			wantMsg:  "500 Internal Server Error",
		},
		{
			name: "404",
			setup: func(t *testing.T) setup {
				return spiffeSrv(t, http.NotFoundHandler())
			},
			wantErr:  ErrStatus,
			wantKind: "status",
			wantMsg:  "404",
		},
		{
			name: "text/html",
			setup: func(t *testing.T) setup {
				return spiffeSrv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/html; charset=utf-8")
					_, _ = w.Write(fx.doc)
				}))
			},
			wantErr:  ErrContentType,
			wantKind: "content_type",
		},
		{
			name: "garbage JSON",
			setup: func(t *testing.T) setup {
				return spiffeSrv(t, serveDoc([]byte(`{"keys": [ {"kty": `)))
			},
			wantErr:  ErrBundle,
			wantKind: "bundle",
		},
		{
			name: "trailing garbage",
			setup: func(t *testing.T) setup {
				return spiffeSrv(t, serveDoc(append(append([]byte{}, fx.doc...), []byte(`{"keys":[]}`)...)))
			},
			wantErr:  ErrBundle,
			wantKind: "bundle",
		},
		{
			name: "keys missing",
			setup: func(t *testing.T) setup {
				return spiffeSrv(t, serveDoc([]byte(`{"spiffe_sequence":1}`)))
			},
			wantErr:  ErrBundle,
			wantKind: "bundle",
		},
		{
			name: "redirect to http",
			setup: func(t *testing.T) setup {
				plain := httptest.NewServer(serveDoc(fx.doc))
				t.Cleanup(plain.Close)
				return spiffeSrv(t, http.RedirectHandler(plain.URL, http.StatusFound))
			},
			wantErr:  ErrRedirect,
			wantKind: "redirect",
			wantMsg:  "scheme must be https",
		},
		{
			name: "redirect loop",
			setup: func(t *testing.T) setup {
				return spiffeSrv(t, http.RedirectHandler("/again", http.StatusTemporaryRedirect))
			},
			wantErr:  ErrRedirect,
			wantKind: "redirect",
			wantMsg:  "more than 3 redirect(s)",
		},
		{
			name: "redirect to another host with the wrong identity",
			setup: func(t *testing.T) setup {
				wrong := svidCert(t, fx.ca, "spiffe://example.org/somebody-else")
				target := startTLS(t, serveDoc(fx.doc), &wrong)
				return spiffeSrv(t, http.RedirectHandler(target.URL, http.StatusFound))
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
			wantMsg:  "somebody-else",
		},
		{
			name: "expired server certificate",
			setup: func(t *testing.T) setup {
				expired := svidCert(t, fx.ca, fetchServerID, testca.Options{
					NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
				})
				return setup{url: startTLS(t, serveDoc(fx.doc), &expired).URL}
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
			wantMsg:  "expired",
		},
		{
			name: "wrong endpoint SPIFFE ID",
			setup: func(t *testing.T) setup {
				wrong := svidCert(t, fx.ca, "spiffe://example.org/workload")
				return setup{url: startTLS(t, serveDoc(fx.doc), &wrong).URL}
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
			wantMsg:  `"spiffe://example.org/workload"`,
		},
		{
			name: "SVID from another trust domain",
			setup: func(t *testing.T) setup {
				foreign := svidCert(t, other, "spiffe://other.org/bundle-server")
				return setup{url: startTLS(t, serveDoc(fx.doc), &foreign).URL}
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
		},
		{
			name: "right SPIFFE ID signed by another trust domain's CA",
			setup: func(t *testing.T) setup {
				forged := svidCert(t, other, fetchServerID)
				return setup{url: startTLS(t, serveDoc(fx.doc), &forged).URL}
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
		},
		{
			name: "leaf is a CA",
			setup: func(t *testing.T) setup {
				caLeaf := svidCert(t, fx.ca, fetchServerID, testca.Options{Mutate: func(c *x509.Certificate) {
					c.IsCA = true
					c.KeyUsage |= x509.KeyUsageCertSign
				}})
				return setup{url: startTLS(t, serveDoc(fx.doc), &caLeaf).URL}
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
		},
		{
			name: "no roots held for the endpoint trust domain",
			setup: func(t *testing.T) setup {
				s := setup{url: startTLS(t, serveDoc(fx.doc), &good).URL}
				s.cfg.Roots = BundleSourceFunc(func(spiffeid.TrustDomain) (*x509bundle.Bundle, bool) { return nil, false })
				return s
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
			wantMsg:  "no X.509 roots held",
		},
		{
			name: "bundle source answers with another trust domain's roots",
			setup: func(t *testing.T) setup {
				forged := svidCert(t, other, fetchServerID)
				s := setup{url: startTLS(t, serveDoc(fx.doc), &forged).URL}
				s.cfg.Roots = BundleSourceFunc(func(spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
					return x509bundle.FromX509Authorities(other.TrustDomain, []*x509.Certificate{other.Cert}), true
				})
				return s
			},
			wantErr:  ErrTLS,
			wantKind: "tls",
			wantMsg:  `roots of "other.org"`,
		},
		{
			name: "TLS 1.1 server",
			setup: func(t *testing.T) setup {
				srv := httptest.NewUnstartedServer(serveDoc(fx.doc))
				srv.Config.ErrorLog = log.New(io.Discard, "", 0)
				srv.TLS = &tls.Config{Certificates: []tls.Certificate{good}, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}
				srv.StartTLS()
				t.Cleanup(srv.Close)
				return setup{url: srv.URL}
			},
			wantKind: "tls",
			wantMsg:  "version",
		},
		{
			name: "not TLS at all",
			setup: func(t *testing.T) setup {
				plain := httptest.NewServer(serveDoc(fx.doc))
				t.Cleanup(plain.Close)
				return setup{url: strings.Replace(plain.URL, "http://", "https://", 1)}
			},
			wantKind: "transport",
			wantMsg:  "HTTPS client",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := tt.setup(t)
			s.cfg.AllowPrivate = true
			ep := spiffeEndpoint(t, s.url)
			if s.ep != nil {
				ep = s.ep(s.url)
			}
			// The fetch's deadline passes only when the test says so: a
			// fetch that ends without it was not held up by its timeout,
			// and one held open by a fault ends when it passes.
			var deadlines testDeadlines
			s.cfg.withTimeout = deadlines.withTimeout
			type result struct {
				res *FetchResult
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := fx.fetcher(s.cfg).Fetch(t.Context(), ep, "")
				done <- result{res, err}
			}()
			if s.engaged != nil {
				select {
				case <-s.engaged:
				case r := <-done:
					t.Fatalf("the fetch ended (%v) before reaching the fault", r.err)
				}
				select {
				case r := <-done:
					t.Fatalf("the fetch ended (%v) before its deadline", r.err)
				default:
				}
				deadlines.expire()
			}
			r := <-done
			res, err := r.res, r.err
			require.Error(t, err)
			t.Log(err)
			assert.Nil(t, res)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
			}
			assert.Equal(t, tt.wantKind, FetchErrorKind(err), "error: %v", err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.True(t, strings.HasPrefix(err.Error(), "federation: fetch "), "error: %v", err)
		})
	}
}

// blackhole returns the address of a listener that accepts connections and
// never answers.
func blackhole(t *testing.T) string {
	t.Helper()
	addr, _ := engagedBlackhole(t)
	return addr
}

// engagedBlackhole is blackhole, with a channel signalled when a
// connection is accepted.
func engagedBlackhole(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	engaged := make(chan struct{}, 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			notifyNonBlocking(engaged)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String(), engaged
}

func TestFetchRedirect(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	good := svidCert(t, fx.ca, fetchServerID)
	var targetHits, originHits atomic.Int32
	target := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		targetHits.Add(1)
		serveDoc(fx.doc)(w, r)
	}), &good)
	origin := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		originHits.Add(1)
		http.Redirect(w, r, target.URL+"/moved", http.StatusFound)
	}), &good)
	f := fx.fetcher(FetcherConfig{AllowPrivate: true})
	ep := spiffeEndpoint(t, origin.URL)

	for range 2 {
		res, err := f.Fetch(t.Context(), ep, "")
		require.NoError(t, err)
		assert.True(t, res.Bundle.Equal(fx.bundle))
	}
	// Never persisted: every fetch starts at the configured URL.
	assert.Equal(t, int32(2), originHits.Load())
	assert.Equal(t, int32(2), targetHits.Load())

	// Redirects can be turned off.
	_, err := fx.fetcher(FetcherConfig{AllowPrivate: true, MaxRedirects: -1}).Fetch(t.Context(), ep, "")
	assert.ErrorIs(t, err, ErrRedirect)
}

func TestFetchRedirectLoopIsBounded(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	good := svidCert(t, fx.ca, fetchServerID)
	var hits atomic.Int32
	srv := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, fmt.Sprintf("/hop%d", hits.Load()), http.StatusFound)
	}), &good)
	_, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, srv.URL), "")
	assert.ErrorIs(t, err, ErrRedirect)
	// The first request plus the three redirects followed.
	assert.Equal(t, int32(4), hits.Load())
}

func TestFetchContentTypeWarnings(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	good := svidCert(t, fx.ca, fetchServerID)
	tests := []struct {
		contentType string
		warn        bool
	}{
		{"application/json", false},
		{"application/json; charset=utf-8", false},
		{"application/jwk-set+json", false},
		{"", true},
		{"text/plain", true},
		{"application/octet-stream", true},
		{"not a media type;;", true},
	}
	for _, tt := range tests {
		t.Run(tt.contentType, func(t *testing.T) {
			t.Parallel()
			srv := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Setting the header to nil stops net/http sniffing one.
				if tt.contentType == "" {
					w.Header()["Content-Type"] = nil
				} else {
					w.Header().Set("Content-Type", tt.contentType)
				}
				_, _ = w.Write(fx.doc)
			}), &good)
			res, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, srv.URL), "")
			require.NoError(t, err)
			require.NotNil(t, res.Bundle)
			if !tt.warn {
				assert.Empty(t, res.Warnings)
				return
			}
			require.Len(t, res.Warnings, 1)
			assert.Equal(t, CodeContentType, res.Warnings[0].Code)
			assert.Equal(t, -1, res.Warnings[0].Index)
		})
	}
}

func TestFetchReturnsParseWarnings(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	good := svidCert(t, fx.ca, fetchServerID)
	doc := strings.Replace(string(fx.doc), `"keys":[`, `"keys":[{"kty":"AKP","use":"x509-svid"},`, 1)
	srv := startTLS(t, serveDoc([]byte(doc)), &good)
	res, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, srv.URL), "")
	require.NoError(t, err)
	require.Len(t, res.Warnings, 1)
	assert.Equal(t, bundledoc.CodeUnknownKty, res.Warnings[0].Code)
	assert.Len(t, res.Bundle.X509Authorities(), 1)
}

// TestFetchFollowsLatestRoots checks that the roots are looked up at each
// handshake: after the held bundle rotates, the new server SVID verifies.
func TestFetchFollowsLatestRoots(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	rotated := testca.New(t, fetchTD)
	cert := svidCert(t, rotated, fetchServerID)
	srv := startTLS(t, serveDoc(fx.doc), &cert)

	var held atomic.Pointer[x509bundle.Bundle]
	held.Store(x509bundle.FromX509Authorities(td(fetchTD), []*x509.Certificate{fx.ca.Cert}))
	roots := BundleSourceFunc(func(d spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
		return held.Load(), d == td(fetchTD)
	})
	f := NewFetcher(FetcherConfig{AllowPrivate: true, Roots: roots, Timeout: 5 * time.Second})
	ep := spiffeEndpoint(t, srv.URL)

	_, err := f.Fetch(t.Context(), ep, "")
	require.ErrorIs(t, err, ErrTLS)

	held.Store(x509bundle.FromX509Authorities(td(fetchTD), []*x509.Certificate{fx.ca.Cert, rotated.Cert}))
	_, err = f.Fetch(t.Context(), ep, "")
	require.NoError(t, err)
}

func TestFetchCallerCancel(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(ctx, spiffeEndpoint(t, "https://"+blackhole(t)), "")
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, "canceled", FetchErrorKind(err))
}

func TestFetchRefusesBadEndpoints(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	f := fx.fetcher(FetcherConfig{AllowPrivate: true})
	noRoots := NewFetcher(FetcherConfig{AllowPrivate: true})
	tests := []struct {
		name string
		f    *Fetcher
		ep   Endpoint
		want string
	}{
		{"http URL", f, Endpoint{TrustDomain: td(fetchTD), URL: mustURL(t, "http://127.0.0.1/"), Profile: ProfileHTTPSWeb}, "must be https"},
		{"no URL", f, Endpoint{TrustDomain: td(fetchTD), Profile: ProfileHTTPSWeb}, "must be https"},
		{"no trust domain", f, Endpoint{URL: mustURL(t, "https://127.0.0.1/"), Profile: ProfileHTTPSWeb}, "trust domain is missing"},
		{"unknown profile", f, Endpoint{TrustDomain: td(fetchTD), URL: mustURL(t, "https://127.0.0.1/"), Profile: "ftp"}, `profile "ftp"`},
		{"spiffe without ID", f, Endpoint{TrustDomain: td(fetchTD), URL: mustURL(t, "https://127.0.0.1/"), Profile: ProfileHTTPSSPIFFE}, "no endpoint SPIFFE ID"},
		{"spiffe without roots", noRoots, spiffeEndpoint(t, "https://127.0.0.1/"), "needs a bundle source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.f.Fetch(t.Context(), tt.ep, "")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestFetchRefusesLoopbackBeforeConnecting(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()

	_, port, err := net.SplitHostPort(l.Addr().String())
	require.NoError(t, err)
	// The literal, its IPv4-mapped form, and a name resolving to it: the
	// check runs on the resolved address.
	for _, host := range []string{l.Addr().String(), "[::ffff:127.0.0.1]:" + port, "localhost:" + port} {
		_, err = fx.fetcher(FetcherConfig{}).Fetch(t.Context(), spiffeEndpoint(t, "https://"+host+"/"), "")
		require.ErrorIs(t, err, ErrRefusedAddress)
		assert.Equal(t, "refused_address", FetchErrorKind(err))
		assert.Contains(t, err.Error(), "loopback")
		assert.Contains(t, err.Error(), "--federation-allow-private")
	}

	// No connection ever reached the listener.
	require.NoError(t, l.Close())
	c, ok := <-accepted
	if ok {
		_ = c.Close()
		t.Fatal("a refused address was connected to")
	}
}

func TestFetchRefusesMetadataAddress(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	// The dialer refuses before connect(2): no packet leaves, so this
	// returns at once even where 169.254.169.254 is unroutable. The
	// fetch's deadline never passes (the test never expires it), so a
	// fetch that waited for a connection to time out would not return.
	var deadlines testDeadlines
	_, err := fx.fetcher(FetcherConfig{Timeout: 2 * time.Second, withTimeout: deadlines.withTimeout}).Fetch(t.Context(), web(t, fetchTD, "https://169.254.169.254/latest/meta-data/"), "")
	require.ErrorIs(t, err, ErrRefusedAddress)
	assert.Contains(t, err.Error(), "169.254.169.254:443")
	assert.Contains(t, err.Error(), "metadata")
	assert.NotEqual(t, "timeout", FetchErrorKind(err))
}

func TestFetchErrorKind(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "", FetchErrorKind(nil))
	assert.Equal(t, "transport", FetchErrorKind(errors.New("boom")))
	assert.Equal(t, "too_large", FetchErrorKind(fmt.Errorf("x: %w", bundledoc.ErrTooLarge)))
}

// TestFetchInteropGoSPIFFEHandler polls go-spiffe's reference bundle
// endpoint handler over both profiles.
func TestFetchInteropGoSPIFFEHandler(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	jwtKey := testca.NewKey(t, testca.ECP256).Public()
	served := fx.bundle.Clone()
	require.NoError(t, served.AddJWTAuthority("kid-1", jwtKey))
	h, err := gofed.NewHandler(td(fetchTD), served)
	require.NoError(t, err)

	t.Run(string(ProfileHTTPSSPIFFE), func(t *testing.T) {
		cert := svidCert(t, fx.ca, fetchServerID)
		srv := startTLS(t, h, &cert)
		res, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, srv.URL), "")
		require.NoError(t, err)
		assert.Empty(t, res.Warnings)
		assert.True(t, res.Bundle.Equal(served))
	})
	t.Run(string(ProfileHTTPSWeb), func(t *testing.T) {
		srv := startTLS(t, h, nil)
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		res, err := fx.fetcher(FetcherConfig{AllowPrivate: true, WebRoots: pool}).Fetch(t.Context(), web(t, fetchTD, srv.URL), "")
		require.NoError(t, err)
		assert.True(t, res.Bundle.Equal(served))
		k, ok := res.Bundle.FindJWTAuthority("kid-1")
		require.True(t, ok)
		assert.True(t, k.(interface{ Equal(crypto.PublicKey) bool }).Equal(jwtKey))
	})
}

// TestFetchLeavesNoGoroutines checks that no connection or transport
// goroutine outlives a poll (keep-alives off, idle connections closed).
func TestFetchLeavesNoGoroutines(t *testing.T) {
	fx := newFetchFixture(t)
	cert := svidCert(t, fx.ca, fetchServerID)
	srv := httptest.NewUnstartedServer(serveDoc(fx.doc))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	opts := goleak.IgnoreCurrent()

	f := fx.fetcher(FetcherConfig{AllowPrivate: true})
	for range 3 {
		_, err := f.Fetch(t.Context(), spiffeEndpoint(t, srv.URL), "")
		require.NoError(t, err)
	}
	srv.Close()
	goleak.VerifyNone(t, opts)
}
