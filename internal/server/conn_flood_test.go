package server

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/internal/identityapi"
	"k8s.io/apimachinery/pkg/api/resource"
)

// floodTarget is a server with the certificate service, the bundle
// endpoint (https_spiffe) and the admin listener on loopback, and their
// addresses.
type floodTarget struct {
	*attackTarget
	bundle string // host:port
}

// startFloodTarget runs it; mutate, if set, changes the options last.
func startFloodTarget(tb testing.TB, mutate func(*Config)) *floodTarget {
	tb.Helper()
	at := startAttackTarget(tb, func(o *Config) {
		o.Bundle = BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true}
		if mutate != nil {
			mutate(o)
		}
	})
	u := servertest.LogAttr(tb, at.logs.String(), servertest.BundleEndpointStarted, "endpoint_url")
	host := strings.TrimSuffix(strings.TrimPrefix(u, "https://"), "/")
	_, port, err := net.SplitHostPort(host)
	require.NoError(tb, err)
	return &floodTarget{attackTarget: at, bundle: net.JoinHostPort("127.0.0.1", port)}
}

// flood opens n connections from local to addr, width at a time, and
// returns those the server kept; it closes them at the end of the test.
func flood(tb testing.TB, addr, local string, kind servertest.FloodKind, n int) (held []net.Conn, refused int) {
	tb.Helper()
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				c := servertest.FloodConn(tb, addr, local, kind)
				mu.Lock()
				if c == nil {
					refused++
				} else {
					held = append(held, c)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	tb.Cleanup(func() { closeAll(held) })
	return held, refused
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// needOpenFiles skips the test when the process may not open n files.
func needOpenFiles(tb testing.TB, n uint64) {
	tb.Helper()
	var lim syscall.Rlimit
	require.NoError(tb, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Cur < n {
		tb.Skipf("open-files limit %d is below the %d this flood needs (both ends of every connection it holds); raise it with ulimit -n", lim.Cur, n)
	}
}

// manifestMemoryLimit is the container memory limit of deploy/base.
func manifestMemoryLimit(tb testing.TB) int64 {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "deployment.yaml"))
	require.NoError(tb, err)
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name      string `yaml:"name"`
						Resources struct {
							Limits map[string]string `yaml:"limits"`
						} `yaml:"resources"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	require.NoError(tb, yaml.Unmarshal(data, &d))
	require.NotEmpty(tb, d.Spec.Template.Spec.Containers)
	q, err := resource.ParseQuantity(d.Spec.Template.Spec.Containers[0].Resources.Limits["memory"])
	require.NoError(tb, err)
	return q.Value()
}

// fromClient is an HTTP client whose connections come from local and
// check no server certificate (the test checks what is served, not who).
func fromClient(local string) *http.Client {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:     d.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // see above
	}}
}

func getFrom(tb testing.TB, c *http.Client, url string) (int, string) {
	tb.Helper()
	resp, err := c.Get(url)
	require.NoError(tb, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return resp.StatusCode, string(body)
}

// TestConnectionFlood reproduces issue 32 item 2 against a real server
// with the default limits: one address (127.0.0.1) opens connections to
// each TCP listener and keeps every one the server accepts, idle (TLS and
// the HTTP/2 preface and nothing else on the certificate service and the
// bundle endpoint, one answered request on the admin listener). Each
// listener keeps exactly its per-source limit (on the certificate
// service, of connections no call has confirmed: half of it) and
// refuses the rest at accept, counting each refusal; clients from another address
// (127.0.0.2) are served on all three meanwhile.
// Deadlines that would close the flood's connections are set beyond the
// test, so the counts do not depend on its speed.
func TestConnectionFlood(t *testing.T) {
	const grpcN, bundleN, adminN = 2000, 1000, 300
	def := []ListenerLimits{grpcLimits, bundleLimits, AdminLimits}
	needOpenFiles(t, uint64(2*(grpcLimits.def.PerSource+bundleLimits.def.PerSource+AdminLimits.def.PerSource)+1024))
	ft := startFloodTarget(t, func(o *Config) {
		o.GRPC.FirstCallTimeout = time.Hour
		o.Bundle.IdleTimeout = time.Hour
	})
	start := time.Now()

	type result struct {
		name   string
		held   []net.Conn
		refuse int
		n      int
		per    int
		reason string
	}
	_, grpcUnconfirmed := unconfirmedLimits(grpcLimits.def)
	per := []int{grpcUnconfirmed, bundleLimits.def.PerSource, AdminLimits.def.PerSource}
	reasons := []string{"unconfirmed_source_limit", "source_limit", "source_limit"}
	var results []result
	for i, f := range []struct {
		addr string
		kind servertest.FloodKind
		n    int
	}{{ft.grpc, servertest.FloodH2, grpcN}, {ft.bundle, servertest.FloodH2, bundleN}, {ft.admin, servertest.FloodHTTP, adminN}} {
		held, refused := flood(t, f.addr, "127.0.0.1", f.kind, f.n)
		results = append(results, result{def[i].name, held, refused, f.n, per[i], reasons[i]})
	}
	for _, r := range results {
		assert.Equal(t, r.per, len(r.held), "%s: the source's limit, and not one more", r.name)
		assert.Equal(t, r.n-r.per, r.refuse, "%s: the rest refused", r.name)
	}

	// Legitimate clients from another address are served on all three.
	svid, csr := legitSVID(t, ft.attackTarget, "127.0.0.2")
	renew := dialFrom(t, ft.grpc, "127.0.0.2", svid)
	resp, err := renew.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	require.NoError(t, err)
	assert.NotEmpty(t, resp.GetCertChain())
	c := fromClient("127.0.0.2")
	code, body := getFrom(t, c, "https://"+ft.bundle+"/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"keys"`)
	code, _ = getFrom(t, c, "http://"+ft.admin+"/healthz")
	assert.Equal(t, http.StatusOK, code)

	// Memory is judged by TestConnectionFloodServerMemory, on the binary
	// alone in a memory cgroup: this process holds the flood's ends too,
	// and whatever the package's earlier tests left.
	t.Logf("%d connections held, %d refused; %s", len(results[0].held)+len(results[1].held)+len(results[2].held),
		results[0].refuse+results[1].refuse+results[2].refuse, time.Since(start).Round(time.Millisecond))

	metric := func(name string, labels ...string) float64 {
		return servertest.MetricVia(t, c, ft.admin, name, labels...)
	}
	for _, r := range results {
		assert.EqualValues(t, r.refuse, metric("trustbridge_listener_connections_refused_total", `listener="`+r.name+`"`, `reason="`+r.reason+`"`),
			"%s: every refusal counted", r.name)
		assert.Zero(t, metric("trustbridge_listener_connections_refused_total", `listener="`+r.name+`"`, `reason="total_limit"`), r.name)
		assert.GreaterOrEqual(t, metric("trustbridge_listener_connections_open", `listener="`+r.name+`"`), float64(r.per), r.name)
	}

	// Refusals are logged at a bounded rate: a burst of 10 per listener,
	// then one a second (loglimit's defaults).
	warned := ft.logCount("WARN", "connection refused at accept: limit reached")
	bound := len(results) * (10 + int(time.Since(start).Seconds()) + 1)
	assert.Positive(t, warned)
	assert.LessOrEqual(t, warned, bound, "refusals are not logged one line each")
	assert.Zero(t, ft.logCount("ERROR", "connection refused"))
}

// TestGRPCFirstCallTimeout: with --grpc-first-call-timeout, a connection
// to the certificate service that completes TLS and the HTTP/2 preface
// and makes no call is closed at the deadline, and so is one whose only
// call failed to authenticate; one whose call authenticated stays.
func TestGRPCFirstCallTimeout(t *testing.T) {
	// Long enough for the authenticated call on a loaded machine (it is
	// checked only if it made it), short enough for a test.
	const deadline = 5 * time.Second
	ft := startFloodTarget(t, func(o *Config) { o.GRPC.FirstCallTimeout = deadline })

	// Authenticated first: its deadline passes before the others'.
	dialed := time.Now()
	svid, csr := legitSVID(t, ft.attackTarget, "127.0.0.20")
	var dials atomic.Int64
	authed := watchedConn(t, ft.grpc, "127.0.0.20", svid, &dials, nil)
	req := &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600}
	_, err := authed.CreateCertificate(context.Background(), req)
	require.NoError(t, err)
	authedInTime := time.Since(dialed) < deadline

	idle := servertest.FloodConn(t, ft.grpc, "127.0.0.21", servertest.FloodH2)
	require.NotNil(t, idle)
	defer idle.Close()
	var unauthDials atomic.Int64
	unauthClosed := make(chan struct{})
	unauth := watchedConn(t, ft.grpc, "127.0.0.22", nil, &unauthDials, unauthClosed)
	_, err = unauth.CreateCertificate(context.Background(), req)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)

	// Wait on the closes themselves: a read that ends, a watched
	// connection's close.
	_ = idle.SetReadDeadline(time.Now().Add(time.Minute))
	_, err = io.Copy(io.Discard, idle)
	require.NoError(t, err, "the server closed the idle connection (EOF), before the test's own minute")
	select {
	case <-unauthClosed:
	case <-time.After(time.Minute):
		t.Fatal("the connection whose call failed to authenticate is still open after a minute")
	}
	assert.EqualValues(t, 2, ft.metric(t, "trustbridge_listener_connections_unconfirmed_closed_total", `listener="grpc"`))
	assert.Equal(t, 2, ft.logCount("INFO", "connection closed: no call confirmed it in time"))

	if !authedInTime {
		t.Logf("the authenticated call took %s, beyond the %s deadline on this machine: not checking that its connection stayed", time.Since(dialed), deadline)
		return
	}
	_, err = authed.CreateCertificate(context.Background(), req)
	require.NoError(t, err)
	assert.EqualValues(t, 1, dials.Load(), "the authenticated connection was kept, not redialled")
}

// A call that authenticates but is then refused, here a renewal by an
// X509-SVID whose grant is older than --max-renewal-lifetime, confirms
// nothing: its connection is closed at the deadline like an idle one.
// (Before, authentication alone confirmed, and such a certificate kept a
// connection for the 15-minute idle limit.)
func TestGRPCRefusedCallDoesNotConfirm(t *testing.T) {
	ft := startFloodTarget(t, func(o *Config) {
		o.GRPC.FirstCallTimeout = 5 * time.Second
		o.GRPC.MaxRenewalLifetime = time.Nanosecond
	})
	svid, csr := legitSVID(t, ft.attackTarget, "127.0.0.30")
	var dials atomic.Int64
	closed := make(chan struct{})
	renew := watchedConn(t, ft.grpc, "127.0.0.31", svid, &dials, closed)
	_, err := renew.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("the connection whose only call was refused is still open after a minute")
	}
	assert.EqualValues(t, 1, ft.metric(t, "trustbridge_listener_connections_unconfirmed_closed_total", `listener="grpc"`))
}

// A MintJWTSVIDs call from an authenticated caller whose every token is
// refused succeeds (each item carries its status) but confirms nothing:
// its connection is closed at the deadline like an idle one. A batch
// with one token minted confirms its connection.
func TestGRPCRefusedBatchDoesNotConfirm(t *testing.T) {
	ft := startFloodTarget(t, func(o *Config) { o.GRPC.FirstCallTimeout = 5 * time.Second })
	svid, _ := legitSVID(t, ft.attackTarget, "127.0.0.32")
	mint := func(local string, closed chan struct{}, audience ...string) {
		var dials atomic.Int64
		cc := dialConnWith(t, ft.grpc, local, svid, func(c net.Conn) net.Conn {
			if dials.Add(1) == 1 && closed != nil {
				return &endWatcher{Conn: c, ended: closed}
			}
			return c
		})
		t.Cleanup(func() { _ = cc.Close() })
		resp, err := identityapi.NewIdentityServiceClient(cc).MintJWTSVIDs(context.Background(), &identityapi.MintJWTSVIDsRequest{
			Requests: []*identityapi.MintJWTSVIDRequest{{Audience: audience}, {Audience: audience}}})
		require.NoError(t, err)
		require.Len(t, resp.GetResults(), 2)
	}
	refused := make(chan struct{})
	mint("127.0.0.33", refused) // no audience: both tokens refused
	minted := make(chan struct{})
	mint("127.0.0.34", minted, "https://api.example.com")
	select {
	case <-refused:
	case <-time.After(time.Minute):
		t.Fatal("the connection whose only batch had every token refused is still open after a minute")
	}
	select {
	case <-minted:
		t.Fatal("the connection whose batch was minted was closed as unconfirmed")
	default:
	}
	assert.EqualValues(t, 1, ft.metric(t, "trustbridge_listener_connections_unconfirmed_closed_total", `listener="grpc"`))
}

// watchedConn is dialFrom's client whose dials are counted in dials and
// whose first connection's end (a read that fails) closes closed, if set.
func watchedConn(tb testing.TB, addr, local string, cert *tls.Certificate, dials *atomic.Int64, closed chan struct{}) securityv1alpha1.IstioCertificateServiceClient {
	tb.Helper()
	cc := dialConnWith(tb, addr, local, cert, func(c net.Conn) net.Conn {
		if dials.Add(1) == 1 && closed != nil {
			return &endWatcher{Conn: c, ended: closed}
		}
		return c
	})
	tb.Cleanup(func() { _ = cc.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(cc)
}

// endWatcher closes ended when a read first fails: the peer closed.
type endWatcher struct {
	net.Conn
	once  sync.Once
	ended chan struct{}
}

func (c *endWatcher) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.once.Do(func() { close(c.ended) })
	}
	return n, err
}

// dialConnWith is dialConn with wrap applied to each connection it dials.
func dialConnWith(tb testing.TB, addr, local string, cert *tls.Certificate, wrap func(net.Conn) net.Conn) *grpc.ClientConn {
	tb.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // see dialFrom
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, err := d.DialContext(ctx, "tcp", a)
			if err != nil {
				return nil, err
			}
			return wrap(c), nil
		}))
	require.NoError(tb, err)
	return cc
}
