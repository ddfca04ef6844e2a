package federation

import (
	"context"
	"crypto/tls"
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

const (
	healthyTD       = "healthy.org"
	healthyServerID = "spiffe://healthy.org/bundle-server"
)

// faultServer is a loopback https_spiffe bundle endpoint whose handler,
// certificate and TCP behaviour can be changed between polls, so one
// poller can see the same endpoint healthy first and faulty next.
type faultServer struct {
	*httptest.Server
	handler switchable
	cert    atomic.Pointer[tls.Certificate]
	hole    *holeListener
}

func startFaultServer(t *testing.T, cert tls.Certificate, h http.HandlerFunc) *faultServer {
	t.Helper()
	fs := &faultServer{}
	fs.handler.set(h)
	fs.cert.Store(&cert)
	srv := httptest.NewUnstartedServer(&fs.handler)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	fs.hole = &holeListener{Listener: srv.Listener, engaged: make(chan struct{}, 1)}
	srv.Listener = fs.hole
	// GetConfigForClient rather than GetCertificate: the client sends no
	// SNI for an IP address, and crypto/tls then skips GetCertificate in
	// favour of the httptest certificate StartTLS puts in Certificates.
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{*fs.cert.Load()}}, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	fs.Server = srv
	return fs
}

// holeListener turns into a blackhole on demand: connections are accepted
// by the kernel and held open, but never handed to the server, so the
// client's TLS handshake waits for an answer that never comes.
type holeListener struct {
	net.Listener
	on      atomic.Bool
	engaged chan struct{} // signalled when a connection is swallowed

	mu   sync.Mutex
	held []net.Conn
}

func (l *holeListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || !l.on.Load() {
			return c, err
		}
		l.mu.Lock()
		l.held = append(l.held, c)
		l.mu.Unlock()
		notifyNonBlocking(l.engaged)
	}
}

func notifyNonBlocking(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (l *holeListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.held {
		_ = c.Close()
	}
	l.held = nil
	return err
}

// faultEnv is a poller federated with two trust domains over https_spiffe,
// each served by its own loopback server: example.org, into which a case
// injects its fault, and healthy.org, which must not notice.
type faultEnv struct {
	fx      *fetchFixture // example.org: CA, published bundle (sequence 7), document
	healthy *testca.CA
	hb      *spiffebundle.Bundle // healthy.org's published bundle (sequence 3)

	faulty, healthySrv *faultServer
	faultyTD           spiffeid.TrustDomain
	healthyTD          spiffeid.TrustDomain

	// engaged is signalled by a fault that holds the request open (the
	// blackhole, the slow body) once the poller's request has reached it.
	engaged chan struct{}

	sink *memSink
	reg  *prometheus.Registry
	p    *Poller
}

// testDeadlines stands in for context.WithTimeout in a fetcher
// (FetcherConfig.withTimeout): the deadlines it hands out pass when the
// test calls expire, so a fetch held open by a fault ends at a point the
// test chooses, not after some amount of real time.
type testDeadlines struct {
	mu     sync.Mutex
	issued []*testDeadlineCtx
}

func (d *testDeadlines) withTimeout(parent context.Context, _ time.Duration) (context.Context, context.CancelFunc) {
	c := &testDeadlineCtx{Context: parent, done: make(chan struct{})}
	stop := context.AfterFunc(parent, func() { c.end(parent.Err()) })
	d.mu.Lock()
	d.issued = append(d.issued, c)
	d.mu.Unlock()
	return c, func() {
		stop()
		c.end(context.Canceled)
	}
}

// expire passes the deadline of every fetch still in flight; those that
// have ended keep the error they ended with.
func (d *testDeadlines) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.issued {
		c.end(context.DeadlineExceeded)
	}
}

// testDeadlineCtx ends as a context.WithTimeout child does: with
// DeadlineExceeded when its deadline passes (expire), with the parent's
// error when the parent ends, and with Canceled when cancelled. Deadline
// and Value are the parent's.
type testDeadlineCtx struct {
	context.Context
	done chan struct{}

	once sync.Once
	mu   sync.Mutex
	err  error
}

func (c *testDeadlineCtx) Done() <-chan struct{} { return c.done }

func (c *testDeadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// end records err before closing done, so whoever sees Done closed reads
// it from Err; only the first end counts.
func (c *testDeadlineCtx) end(err error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.done)
	})
}

// newFaultEnv federates a poller with both trust domains; fc sets the
// fetch Timeout and, for a case that hangs, the deadline hook.
func newFaultEnv(t *testing.T, fc FetcherConfig) *faultEnv {
	t.Helper()
	e := &faultEnv{fx: newFetchFixture(t), healthy: testca.New(t, healthyTD), sink: &memSink{},
		reg: prometheus.NewRegistry(), faultyTD: td(fetchTD), healthyTD: td(healthyTD)}
	e.hb = e.healthy.Bundle()
	e.hb.SetSequenceNumber(3)
	e.faulty = startFaultServer(t, svidCert(t, e.fx.ca, fetchServerID), serveDoc(e.fx.doc))
	e.engaged = e.faulty.hole.engaged
	e.healthySrv = startFaultServer(t, svidCert(t, e.healthy, healthyServerID), serveDoc(docWith(t, e.hb, 3)))

	faultyEP := spiffe(t, fetchTD, e.faulty.URL+"/bundle", fetchServerID)
	faultyEP.BootstrapBundle = e.fx.ca.Bundle()
	healthyEP := spiffe(t, healthyTD, e.healthySrv.URL+"/bundle", healthyServerID)
	healthyEP.BootstrapBundle = e.healthy.Bundle()
	fc.AllowPrivate = true
	p, err := NewPoller(PollerConfig{
		Endpoints:  []Endpoint{faultyEP, healthyEP},
		Fetcher:    fc,
		Sink:       e.sink,
		Registerer: e.reg,
		Rand:       func() float64 { return 0.5 },
	})
	require.NoError(t, err)
	e.p = p
	return e
}

func (e *faultEnv) status(t *testing.T, d spiffeid.TrustDomain) Status {
	t.Helper()
	for _, s := range e.p.Status() {
		if s.TrustDomain == d.Name() {
			return s
		}
	}
	require.Failf(t, "no status", "trust domain %q", d.Name())
	return Status{}
}

func (e *faultEnv) held(d spiffeid.TrustDomain) *spiffebundle.Bundle {
	for _, b := range e.p.Bundles() {
		if b.TrustDomain() == d {
			return b
		}
	}
	return nil
}

// fetchCounts reads trustbridge_federation_fetches_total for d from the
// registry the poller was given, by result label.
func (e *faultEnv) fetchCounts(t *testing.T, d spiffeid.TrustDomain) map[string]float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "trustbridge_federation_fetches_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["trust_domain"] == d.Name() {
				out[labels["result"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestPollerFaultMatrix injects one fault at a time into one of two
// federated trust domains and checks, at the poller level, that the faulty
// trust domain keeps its last good bundle and reports the failure in
// status and metrics, while the other one goes on being refreshed.
//
// "A bundle for another trust domain": a document carries no trust domain
// name, so another trust domain's bundle served at this endpoint parses as
// the expected trust domain's. The poller refuses it when its roots name
// another trust domain in their SPIFFE ID (the foreign_trust_domain parse
// warning), whatever its sequence.
func TestPollerFaultMatrix(t *testing.T) {
	t.Parallel()
	const (
		fast = 5 * time.Second
		// slow is the Timeout a case that hangs reports in its error. No
		// case waits for it: the test passes the hanging fetch's deadline
		// itself (testDeadlines), once the healthy trust domain's poll
		// has finished, so that poll always finishes first.
		slow = 2 * time.Second
	)
	tests := []struct {
		name    string
		timeout time.Duration
		// hangs: the faulty poll stays in flight until its deadline
		// passes, and signals e.engaged once it has reached the fault.
		hangs  bool
		inject func(t *testing.T, e *faultEnv)
		result string // fetches_total result label
		errMsg string // in the Refresh error and in last_error
	}{
		{
			name:   "refused connection",
			inject: func(t *testing.T, e *faultEnv) { e.faulty.Close() },
			result: "transport",
			errMsg: "refused",
		},
		{
			name:    "blackhole",
			timeout: slow,
			hangs:   true,
			inject:  func(t *testing.T, e *faultEnv) { e.faulty.hole.on.Store(true) },
			result:  "timeout",
			errMsg:  "no complete answer within 2s",
		},
		{
			name:    "one byte per second",
			timeout: slow,
			hangs:   true,
			inject: func(t *testing.T, e *faultEnv) {
				e.faulty.handler.set(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					tick := time.NewTicker(time.Second)
					defer tick.Stop()
					for i, c := range e.fx.doc {
						_, _ = w.Write([]byte{c})
						w.(http.Flusher).Flush()
						if i == 0 {
							notifyNonBlocking(e.engaged)
						}
						select {
						case <-r.Context().Done():
							return
						case <-tick.C:
						}
					}
				})
			},
			result: "timeout",
			errMsg: "no complete answer within 2s",
		},
		{
			name: "oversized body",
			inject: func(t *testing.T, e *faultEnv) {
				// The default cap (1 MiB) plus one byte, in a document that
				// would otherwise be valid.
				pad := 1<<20 + 1 - len(e.fx.doc) - len(`,"x":""`)
				doc := strings.TrimSuffix(string(e.fx.doc), "}") + `,"x":"` + strings.Repeat("x", pad) + `"}`
				require.Len(t, doc, 1<<20+1)
				e.faulty.handler.set(serveDoc([]byte(doc)))
			},
			result: "too_large",
			errMsg: "more than 1048576 bytes",
		},
		{
			name: "HTTP 500 with a valid bundle body",
			inject: func(t *testing.T, e *faultEnv) {
				doc := docWith(t, e.fx.bundle, 8)
				e.faulty.handler.set(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = w.Write(doc)
				})
			},
			result: "status",
			errMsg: "500 Internal Server Error",
		},
		{
			name: "text/html",
			inject: func(t *testing.T, e *faultEnv) {
				doc := docWith(t, e.fx.bundle, 8)
				e.faulty.handler.set(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/html; charset=utf-8")
					_, _ = w.Write(doc)
				})
			},
			result: "content_type",
			errMsg: "text/html",
		},
		{
			name:   "garbage JSON",
			inject: func(t *testing.T, e *faultEnv) { e.faulty.handler.set(serveDoc([]byte(`{"keys": [ {"kty": `))) },
			result: "bundle",
			errMsg: "invalid bundle document",
		},
		{
			name: "trailing garbage",
			inject: func(t *testing.T, e *faultEnv) {
				e.faulty.handler.set(serveDoc(append(docWith(t, e.fx.bundle, 8), `{"keys":[]}`...)))
			},
			result: "bundle",
			errMsg: "invalid bundle document",
		},
		{
			name: "another trust domain's bundle",
			inject: func(t *testing.T, e *faultEnv) {
				// What a misrouted URL serves: healthy.org's document at
				// example.org's endpoint, with a higher sequence so that only
				// the trust domain check can stop it.
				e.faulty.handler.set(serveDoc(docWith(t, e.hb, 99)))
			},
			result: "trust_domain_mismatch",
			errMsg: `names trust domain "healthy.org"`,
		},
		{
			name:   "sequence regression",
			inject: func(t *testing.T, e *faultEnv) { e.faulty.handler.set(serveDoc(docWith(t, e.fx.bundle, 6))) },
			result: "sequence_regression",
			errMsg: "fetched 6, held 7",
		},
		{
			name: "same sequence, different content",
			inject: func(t *testing.T, e *faultEnv) {
				e.faulty.handler.set(serveDoc(docWith(t, testca.New(t, fetchTD).Bundle(), 7)))
			},
			result: "sequence_conflict",
			errMsg: "sequence 7, 1 authorities added, 1 removed",
		},
		{
			name: "empty keys",
			inject: func(t *testing.T, e *faultEnv) {
				e.faulty.handler.set(serveDoc([]byte(`{"keys":[],"spiffe_sequence":8}`)))
			},
			result: "empty_bundle",
			errMsg: "no X.509 or JWT authorities",
		},
		{
			name: "redirect to http",
			inject: func(t *testing.T, e *faultEnv) {
				plain := httptest.NewServer(serveDoc(docWith(t, e.fx.bundle, 8)))
				t.Cleanup(plain.Close)
				e.faulty.handler.set(http.RedirectHandler(plain.URL+"/bundle", http.StatusFound).ServeHTTP)
			},
			result: "redirect",
			errMsg: "scheme must be https",
		},
		{
			name: "redirect loop",
			inject: func(t *testing.T, e *faultEnv) {
				e.faulty.handler.set(http.RedirectHandler("/again", http.StatusTemporaryRedirect).ServeHTTP)
			},
			result: "redirect",
			errMsg: "more than 3 redirect(s)",
		},
		{
			name: "redirect to another host with the wrong identity",
			inject: func(t *testing.T, e *faultEnv) {
				wrong := svidCert(t, e.fx.ca, "spiffe://example.org/somebody-else")
				target := startTLS(t, serveDoc(docWith(t, e.fx.bundle, 8)), &wrong)
				e.faulty.handler.set(http.RedirectHandler(target.URL+"/bundle", http.StatusFound).ServeHTTP)
			},
			result: "tls",
			errMsg: "somebody-else",
		},
		{
			name: "expired server certificate",
			inject: func(t *testing.T, e *faultEnv) {
				expired := svidCert(t, e.fx.ca, fetchServerID, testca.Options{
					NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
				})
				e.faulty.cert.Store(&expired)
			},
			result: "tls",
			errMsg: "expired",
		},
		{
			name: "wrong endpoint SPIFFE ID",
			inject: func(t *testing.T, e *faultEnv) {
				wrong := svidCert(t, e.fx.ca, "spiffe://example.org/workload")
				e.faulty.cert.Store(&wrong)
			},
			result: "tls",
			errMsg: `server presented SPIFFE ID "spiffe://example.org/workload"`,
		},
		{
			name: "SVID from another trust domain",
			inject: func(t *testing.T, e *faultEnv) {
				// healthy.org's own bundle server SVID: valid, and signed
				// by roots this poller holds, but for the wrong trust domain.
				foreign := svidCert(t, e.healthy, healthyServerID)
				e.faulty.cert.Store(&foreign)
			},
			result: "tls",
			errMsg: `server presented SPIFFE ID "spiffe://healthy.org/bundle-server"`,
		},
		{
			name: "endpoint SPIFFE ID signed by another federated trust domain",
			inject: func(t *testing.T, e *faultEnv) {
				// The right ID, but issued by healthy.org's CA: only
				// example.org's roots may vouch for an example.org ID.
				forged := svidCert(t, e.healthy, fetchServerID)
				e.faulty.cert.Store(&forged)
			},
			result: "tls",
			errMsg: "endpoint authentication failed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fc := FetcherConfig{Timeout: tt.timeout}
			if fc.Timeout == 0 {
				fc.Timeout = fast
			}
			var deadlines testDeadlines
			if tt.hangs {
				fc.withTimeout = deadlines.withTimeout
			}
			e := newFaultEnv(t, fc)

			// A good poll of both first.
			require.NoError(t, e.p.Refresh(t.Context(), e.faultyTD))
			require.NoError(t, e.p.Refresh(t.Context(), e.healthyTD))
			lastGood := e.sink.get(SourceName(e.faultyTD))
			require.NotNil(t, lastGood)
			require.True(t, e.fx.bundle.Equal(lastGood))
			require.Same(t, lastGood, e.held(e.faultyTD))
			require.Equal(t, StateOK, e.status(t, e.faultyTD).State)
			require.Equal(t, StateOK, e.status(t, e.healthyTD).State)

			tt.inject(t, e)
			// healthy.org rotates meanwhile: a new sequence, which it must
			// get while example.org fails.
			e.healthySrv.handler.set(serveDoc(docWith(t, e.hb, 4)))

			// Both at once: a fault in one trust domain must not hold up
			// the other's poll.
			faultyErr := make(chan error, 1)
			go func() { faultyErr <- e.p.Refresh(t.Context(), e.faultyTD) }()
			if tt.hangs {
				select {
				case <-e.engaged:
				case err := <-faultyErr:
					t.Fatalf("the faulty poll ended (%v) before reaching the fault", err)
				}
			}
			require.NoError(t, e.p.Refresh(t.Context(), e.healthyTD), "healthy trust domain")
			if tt.hangs {
				select {
				case err := <-faultyErr:
					t.Fatalf("the faulty poll ended (%v) before the healthy one", err)
				default:
				}
				deadlines.expire()
			}
			err := <-faultyErr
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.errMsg)

			// (a) The last good bundle is kept, in the sink and in Bundles().
			assert.Same(t, lastGood, e.sink.get(SourceName(e.faultyTD)), "sink")
			assert.Same(t, lastGood, e.held(e.faultyTD), "Bundles()")

			// (b) The failure shows in status.
			st := e.status(t, e.faultyTD)
			assert.Equal(t, StateFailing, st.State)
			assert.Equal(t, err.Error(), st.LastError)
			assert.Equal(t, 1, st.ConsecutiveFailures)
			if assert.NotNil(t, st.Sequence) {
				assert.Equal(t, uint64(7), *st.Sequence, "held sequence")
			}
			assert.NotNil(t, st.LastSuccess)

			// (c) And in the fetches metric, under its own label only.
			assert.Equal(t, map[string]float64{"ok": 1, tt.result: 1}, e.fetchCounts(t, e.faultyTD))

			// (d) The healthy trust domain took its new bundle.
			hs := e.status(t, e.healthyTD)
			assert.Equal(t, StateOK, hs.State)
			assert.Empty(t, hs.LastError)
			assert.Zero(t, hs.ConsecutiveFailures)
			if assert.NotNil(t, hs.Sequence) {
				assert.Equal(t, uint64(4), *hs.Sequence)
			}
			if got := e.sink.get(SourceName(e.healthyTD)); assert.NotNil(t, got) {
				seq, _ := got.SequenceNumber()
				assert.Equal(t, uint64(4), seq)
				assert.True(t, e.held(e.healthyTD).Equal(got))
			}
			assert.Equal(t, map[string]float64{"ok": 2}, e.fetchCounts(t, e.healthyTD))
		})
	}
}
