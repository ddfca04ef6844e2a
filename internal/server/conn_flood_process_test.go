package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/proctest"
)

// binEnv names the trustbridge binary the process-level tests run: make
// unit sets it to bin/trustbridge, the build users run, without the race
// detector, so that the memory measured is the server's own.
const binEnv = "TRUSTBRIDGE_BIN"

// binServer is bin/trustbridge server in a process of its own.
type binServer struct {
	pid                 int
	grpc, bundle, admin string // host:port
	memLimit            int64  // the Go runtime's limit it logged, 0 if none
	exited              chan struct{}
}

// startBinServer runs `trustbridge server` with args beside a fresh data
// directory and loopback listeners, and reads its listeners from its JSON
// start-up record. It is stopped with SIGTERM when the test ends. With a
// memory cgroup (cg non-nil) the process starts in it, as in a container
// with a memory limit.
func startBinServer(t *testing.T, bin string, cg *memCgroup, env []string, args ...string) *binServer {
	t.Helper()
	dir := t.TempDir()
	argv := append([]string{bin, "server", "--trust-domain", "example.org", "--data-dir", filepath.Join(dir, "data"), "--init",
		"--grpc-listen", "127.0.0.1:0", "--bundle-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}, args...)
	if cg != nil {
		// The shell joins the cgroup and becomes the server, so the
		// server is in it from its first instruction.
		argv = append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, cg.procs}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// Killed with the test binary, even when a -timeout panic skips the
	// cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var memLimit atomic.Int64
	var tail strings.Builder
	started := make(chan map[string]string, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if tail.Len() < 64<<10 {
				tail.WriteString(sc.Text() + "\n")
			}
			var rec struct {
				Msg       string            `json:"msg"`
				Listeners map[string]string `json:"listeners"`
				MemLimit  int64             `json:"gomemlimit_bytes"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				continue
			}
			if rec.MemLimit > 0 {
				memLimit.Store(rec.MemLimit)
			}
			if rec.Msg == "trustbridge server started" {
				started <- rec.Listeners
			}
		}
		_ = cmd.Wait()
	}()
	proctest.StopOnCleanup(t, cmd.Process, exited, "trustbridge server")
	select {
	case l := <-started:
		s := &binServer{pid: cmd.Process.Pid, grpc: l["grpc"], bundle: l["bundle"], admin: l["admin"], memLimit: memLimit.Load(), exited: exited}
		require.NotEmpty(t, s.grpc, "listeners %v", l)
		require.NotEmpty(t, s.bundle, "listeners %v", l)
		require.NotEmpty(t, s.admin, "listeners %v", l)
		return s
	case <-exited:
		t.Fatalf("%s server exited before it started:\n%s", bin, tail.String())
	case <-time.After(time.Minute):
		t.Fatalf("%s server did not start within a minute", bin)
	}
	return nil
}

// rss is the server process's resident set (VmRSS).
func (s *binServer) rss(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err, line)
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for pid %d", s.pid)
	return 0
}

// TestConnectionFloodServerMemory is issue 32 item 2's test on the
// binary users run, in a process of its own, so that its RSS is the
// server's alone (TestConnectionFlood's is shared with the flood's own
// ends and, under make test, inflated by the race detector).
//
// First one address floods every listener: each keeps that address's
// share (on the certificate service, of connections no call has
// confirmed), and a client from another address is served on all three.
// Then the worst case the default limits allow: the certificate service
// full of connections that each made a successful call, but for its
// quarter of unconfirmed ones, each of which opens as many calls as gRPC
// lets a connection have (128; pendingStreams of them are let through)
// and sends their headers and no body (every such call holds a
// goroutine and buffers before anything is authenticated); the bundle
// endpoint and the admin listener full too. The server stays under the
// manifests' memory limit, and a new client still gets a certificate: it
// takes the place of the oldest unconfirmed connection. Deadlines that
// would close idle connections are set beyond the test, so the worst case
// is held.
func TestConnectionFloodServerMemory(t *testing.T) {
	bin := os.Getenv(binEnv)
	if bin == "" {
		t.Skipf("%s is unset: make unit sets it to bin/trustbridge (go build ./cmd/trustbridge)", binEnv)
	}
	listeners := []ListenerLimits{grpcLimits, bundleLimits, AdminLimits}
	most := 0
	for _, l := range listeners {
		most += l.def.Max
	}
	needOpenFiles(t, uint64(most+1024))
	const fleetToken = "fleet-bootstrap-token-0123456789abcdef"
	fleetID := "spiffe://example.org/vm/fleet"
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(servertest.LaptopToken+","+servertest.LaptopID.String()+"\n"+fleetToken+","+fleetID+",reusable\n"), 0o600))
	limit := manifestMemoryLimit(t)
	// As in a pod of the manifests: a memory cgroup with their limit,
	// which the kernel enforces, and from which the server sets its Go
	// runtime's limit itself. Where this machine cannot make one, the
	// server is given the limit it would set (GOMEMLIMIT) and its RSS is
	// checked instead of the kernel's verdict.
	cg, why := newMemCgroup(t, limit)
	var env []string
	if cg == nil {
		t.Logf("no memory cgroup (%s): running the server with GOMEMLIMIT as it would set it in one, and checking its RSS", why)
		env = []string{fmt.Sprintf("GOMEMLIMIT=%d", int64(float64(limit)*memoryLimitRatio)+BinaryBallastSize+serverBallastSize)}
	}
	s := startBinServer(t, bin, cg, env, "--bootstrap-token-file", tokens, "--grpc-first-call-timeout", "1h", "--bundle-idle-timeout", "1h")
	if cg != nil {
		assert.Equal(t, int64(float64(limit)*memoryLimitRatio)+BinaryBallastSize+serverBallastSize, s.memLimit,
			"the server set its Go runtime's limit from the cgroup's, plus its ballast, which is never resident")
	}
	rssIdle := s.rss(t)
	pendingTotal, pendingPerSource := unconfirmedLimits(grpcLimits.def)
	kinds := []servertest.FloodKind{servertest.FloodH2, servertest.FloodH2, servertest.FloodHTTP}
	addrs := []string{s.grpc, s.bundle, s.admin}
	shares := []int{pendingPerSource, bundleLimits.def.PerSource, AdminLimits.def.PerSource}
	reasons := []string{"unconfirmed_source_limit", "source_limit", "source_limit"}

	// One address.
	for i, l := range listeners {
		conns, refused := flood(t, addrs[i], "127.0.0.1", kinds[i], 2*l.def.PerSource)
		assert.Equal(t, shares[i], len(conns), "%s: the source's share, and not one more", l.name)
		assert.Equal(t, 2*l.def.PerSource-shares[i], refused, "%s: the rest refused", l.name)
	}
	c := fromClient("127.0.0.2")
	code, body := getFrom(t, c, "https://"+s.bundle+"/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"keys"`)
	code, _ = getFrom(t, c, "http://"+s.admin+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	csr, _ := csrFor(t, servertest.LaptopID)
	createCert(t, s.grpc, "127.0.0.2", servertest.LaptopToken, csr)
	rssOne := s.rss(t)
	for i, l := range listeners {
		assert.EqualValues(t, 2*l.def.PerSource-shares[i], servertest.MetricVia(t, c, s.admin, "trustbridge_listener_connections_refused_total",
			`listener="`+l.name+`"`, `reason="`+reasons[i]+`"`), l.name)
	}
	c.CloseIdleConnections()

	// The worst case. Metrics are read over one kept-alive connection of
	// an address of its own, opened before the admin listener fills.
	m := fromClient("127.0.0.252")
	t.Cleanup(m.CloseIdleConnections)
	metric := func(name, listener string, labels ...string) float64 {
		return servertest.MetricVia(t, m, s.admin, name, append(labels, `listener="`+listener+`"`)...)
	}
	fleetCSR, _ := csrFor(t, spiffeid.RequireFromString(fleetID))
	confirmed := grpcLimits.def.Max - pendingTotal
	for n, src := 0, 10; n < confirmed; src++ {
		k := min(grpcLimits.def.PerSource, confirmed-n)
		keepConfirmed(t, s.grpc, "127.0.0."+strconv.Itoa(src), fleetToken, fleetCSR, k)
		n += k
	}
	for src := 30; src < 30+pendingTotal/pendingPerSource; src++ {
		for range pendingPerSource {
			require.NotNil(t, dialHeaderOnlyCalls(t, s.grpc, "127.0.0."+strconv.Itoa(src), certservice.MaxConcurrentStreams), "an unconfirmed connection within the shares")
		}
	}
	assert.EqualValues(t, grpcLimits.def.Max, metric("trustbridge_listener_connections_open", "grpc"))
	// Measure once the server has read every call the flood sent: all
	// but pendingStreams of each connection's are refused.
	refusedCalls := float64(pendingTotal * (certservice.MaxConcurrentStreams - pendingStreams))
	require.Eventually(t, func() bool { return metric("trustbridge_listener_streams_refused_total", "grpc") >= refusedCalls },
		time.Minute, 50*time.Millisecond, "calls beyond pendingStreams refused")
	for i, l := range listeners[1:] {
		for src := 60 + 40*i; metric("trustbridge_listener_connections_open", l.name) < float64(l.def.Max); src++ {
			require.Less(t, src, 60+40*(i+1), "%s never filled", l.name)
			flood(t, addrs[i+1], "127.0.0."+strconv.Itoa(src), kinds[i+1], l.def.PerSource)
		}
		conns, refused := flood(t, addrs[i+1], "127.0.0.251", kinds[i+1], 1)
		assert.Empty(t, conns, "%s: over its total", l.name)
		assert.Equal(t, 1, refused, l.name)
		assert.Positive(t, metric("trustbridge_listener_connections_refused_total", l.name, `reason="total_limit"`), l.name)
	}
	rssFull := s.rss(t)
	select {
	case <-s.exited:
		t.Fatalf("the server exited under the flood (OOM-killed? cgroup failcnt %d)", cg.failcnt(t))
	default:
	}
	evicted := metric("trustbridge_listener_connections_evicted_total", "grpc") // the first address's, oldest
	createCert(t, s.grpc, "127.0.0.253", fleetToken, fleetCSR)
	assert.Equal(t, evicted+1, metric("trustbridge_listener_connections_evicted_total", "grpc"), "the new client took an unconfirmed connection's place")
	t.Logf("server RSS: %d MiB idle, %d MiB with one address's flood, %d MiB with every listener full (%d confirmed and %d unconfirmed connections with %d calls each on gRPC); limit %d MiB",
		rssIdle>>20, rssOne>>20, rssFull>>20, confirmed, pendingTotal, pendingStreams, limit>>20)
	assert.Less(t, rssOne, limit)
	assert.Less(t, rssFull, limit, "the most the default limits allow fits the manifests' memory limit")
	if cg != nil {
		peak := cg.peak(t)
		t.Logf("cgroup peak usage %d MiB of %d MiB", peak>>20, limit>>20)
		assert.Zero(t, cg.failcnt(t), "the server never hit the cgroup's limit")
	}
}

// memCgroup is a memory cgroup of the test's own, removed at its end.
type memCgroup struct {
	dir, procs     string
	peakFile, fail string
}

// newMemCgroup makes a child of this process's memory cgroup limited to
// limit bytes (cgroup v1's memory controller, or v2's), or says why it
// cannot (not root, no memory controller).
func newMemCgroup(t *testing.T, limit int64) (*memCgroup, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, "not root"
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err.Error()
	}
	const prefix = "trustbridge-flood-"
	name := fmt.Sprintf("%s%d", prefix, os.Getpid())
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var cg *memCgroup
		switch {
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			dir := filepath.Join("/sys/fs/cgroup/memory", f[2], name)
			cg = &memCgroup{dir: dir, procs: filepath.Join(dir, "cgroup.procs"),
				peakFile: filepath.Join(dir, "memory.max_usage_in_bytes"), fail: filepath.Join(dir, "memory.failcnt")}
			if err := os.Mkdir(dir, 0o755); err != nil {
				return nil, err.Error()
			}
			if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
				_ = os.Remove(dir)
				return nil, err.Error()
			}
		case f[0] == "0" && f[1] == "":
			ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
			if err != nil || !slices.Contains(strings.Fields(string(ctrl)), "memory") {
				continue
			}
			dir := filepath.Join("/sys/fs/cgroup", f[2], name)
			cg = &memCgroup{dir: dir, procs: filepath.Join(dir, "cgroup.procs"), peakFile: filepath.Join(dir, "memory.peak")}
			if err := os.Mkdir(dir, 0o755); err != nil {
				return nil, err.Error()
			}
			if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
				_ = os.Remove(dir)
				return nil, err.Error()
			}
		default:
			continue
		}
		// Removed once the server has exited (its cleanup runs first);
		// those of earlier runs killed before their cleanups, now empty,
		// with it.
		t.Cleanup(func() {
			stale, _ := filepath.Glob(filepath.Join(filepath.Dir(cg.dir), prefix+"*"))
			for _, d := range stale {
				if err := os.Remove(d); err != nil && d == cg.dir {
					t.Errorf("removing the test's memory cgroup: %v", err)
				}
			}
		})
		return cg, ""
	}
	return nil, "no memory controller in /proc/self/cgroup"
}

// peak is the cgroup's highest memory usage, -1 where the kernel does not
// keep it (cgroup v2's memory.peak is from Linux 5.19).
func (c *memCgroup) peak(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(c.peakFile)
	if os.IsNotExist(err) {
		return -1
	}
	require.NoError(t, err)
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	require.NoError(t, err)
	return n
}

// failcnt is how often usage hit the limit (cgroup v1; 0 on v2, whose
// OOM kill the server's exit shows).
func (c *memCgroup) failcnt(t *testing.T) int64 {
	t.Helper()
	if c == nil || c.fail == "" {
		return 0
	}
	data, err := os.ReadFile(c.fail)
	require.NoError(t, err)
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	require.NoError(t, err)
	return n
}

// createCert asks for a certificate with a bearer token over a new
// connection from local, and closes it.
func createCert(t *testing.T, addr, local, token, csr string) {
	t.Helper()
	cc := dialConn(t, addr, local, nil)
	defer cc.Close()
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(withBearer(context.Background(), token),
		&securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	require.NoError(t, err, "a certificate from %s", local)
	assert.NotEmpty(t, resp.GetCertChain())
}

// keepConfirmed opens n connections from local, each confirmed by a
// successful CreateCertificate, and keeps them open until the test ends.
func keepConfirmed(t *testing.T, addr, local, token, csr string, n int) {
	t.Helper()
	for range n {
		cc := dialConn(t, addr, local, nil)
		t.Cleanup(func() { _ = cc.Close() })
		_, err := securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(withBearer(context.Background(), token),
			&securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
		require.NoError(t, err)
	}
}

// dialHeaderOnlyCalls completes TLS and the HTTP/2 preface from local and
// opens n CreateCertificate calls, sending their headers and no body: the
// review's attack, each call parked in the server before authentication.
// It returns nil if the server refused the connection.
func dialHeaderOnlyCalls(t *testing.T, addr, local string, n int) net.Conn {
	t.Helper()
	c := servertest.DialIdleH2(addr, local)
	if c == nil {
		return nil
	}
	t.Cleanup(func() { _ = c.Close() })
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fr := http2.NewFramer(c, nil)
	for i := range n {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", "/istio.v1.auth.IstioCertificateService/CreateCertificate"},
			{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			require.NoError(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
		}
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true}))
	}
	return c
}
