package bundlebench

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

const (
	// conns is the number of keep-alive client connections per server.
	conns = 16
	// rounds: each run alternates the servers in this many rounds, the
	// order rotating, so that a burst of load from elsewhere on a shared
	// machine falls on all of them.
	rounds = 6
	// trustDomain is the served trust domain's name.
	trustDomain = "example.org"
)

// The static server is this test binary, re-executed with staticEnv set
// and the certificate, key and body files in the other variables.
const (
	staticEnv     = "BUNDLEBENCH_STATIC"
	staticCertEnv = "BUNDLEBENCH_STATIC_CERT"
	staticKeyEnv  = "BUNDLEBENCH_STATIC_KEY"
	staticBodyEnv = "BUNDLEBENCH_STATIC_BODY"
)

func TestMain(m *testing.M) {
	if os.Getenv(staticEnv) != "" {
		if err := runStatic(); err != nil {
			fmt.Fprintln(os.Stderr, "static server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runStatic is the baseline process: a bare handler writing the bytes
// trustbridge served, behind the TLS configuration and server settings
// bundleserver.Server.Serve uses, with the certificate trustbridge reads
// from the same files. It prints its address and serves on loopback until
// its stdin closes (the benchmark ended or died).
func runStatic() error {
	body, err := os.ReadFile(os.Getenv(staticBodyEnv))
	if err != nil {
		return err
	}
	fc := bundleserver.NewFileCertificate(os.Getenv(staticCertEnv), os.Getenv(staticKeyEnv), clock.RealClock{}, nil)
	if err := fc.Load(); err != nil {
		return err
	}
	srv, err := bundleserver.New(bundleserver.Config{
		TrustDomain:    spiffeid.RequireTrustDomainFromString(trustDomain),
		Local:          bundleserver.SourceFunc(func() *spiffebundle.Bundle { return nil }),
		GetCertificate: fc.GetCertificate,
	})
	if err != nil {
		return err
	}
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			// As bundleserver's in-process baseline:static.
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set("Content-Length", strconv.Itoa(len(body)))
			_, _ = w.Write(body)
		}),
		TLSConfig:         srv.TLSConfig(),
		ReadHeaderTimeout: bundleserver.DefaultReadHeaderTimeout,
		ReadTimeout:       bundleserver.DefaultReadTimeout,
		WriteTimeout:      bundleserver.DefaultWriteTimeout,
		IdleTimeout:       bundleserver.DefaultIdleTimeout,
		MaxHeaderBytes:    bundleserver.MaxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: bundleserver.DefaultMaxConcurrentStreams,
			WriteByteTimeout:     bundleserver.DefaultWriteTimeout,
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", ln.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = hs.Close()
	}()
	if err := hs.ServeTLS(ln, "", ""); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// BenchmarkWholeProcess (issue 20 item 6): one op is one GET of the local
// bundle from trustbridge; the static server gets as many in the same
// rounds, untimed. Metrics:
//   - req/s and static-req/s: throughput of each over its rounds;
//   - x-static-req/s: trustbridge's throughput over the static server's
//     (the issue's goal is at least 0.90);
//   - cpu-us/req and static-cpu-us/req: each server process's CPU time
//     per request (from /proc, 10 ms ticks), the per-request cost without
//     the client's share of the two cores;
//   - with TRUSTBRIDGE_BIN_BASE: base-req/s, base-x-static-req/s,
//     base-cpu-us/req and x-base-req/s (trustbridge over the base binary).
func BenchmarkWholeProcess(b *testing.B) {
	bin := os.Getenv("TRUSTBRIDGE_BIN")
	if bin == "" {
		b.Skip("TRUSTBRIDGE_BIN is unset: run make bench, or set it to a trustbridge binary")
	}
	e := newEnv(b)
	ours := e.startTrustbridge(b, "ours", bin)
	body := ours.fetchBody(b, e.tls)
	targets := []*target{ours, e.startStatic(b, body)}
	if base := os.Getenv("TRUSTBRIDGE_BIN_BASE"); base != "" {
		targets = append(targets, e.startTrustbridge(b, "base", base))
	}
	b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
		b.StopTimer()
		for _, t := range targets {
			t.reset(b, e.tls, body)
		}
		for r := range rounds {
			n := b.N / rounds
			if r < b.N%rounds {
				n++
			}
			for i := range targets {
				t := targets[(r+i)%len(targets)]
				t.run(b, n, t == ours)
			}
		}
		report(b, targets)
	})
}

func report(b *testing.B, targets []*target) {
	ours, static := targets[0], targets[1]
	b.ReportMetric(ours.rate(), "req/s")
	b.ReportMetric(static.rate(), "static-req/s")
	b.ReportMetric(ours.rate()/static.rate(), "x-static-req/s")
	b.ReportMetric(ours.cpuPerReq(), "cpu-us/req")
	b.ReportMetric(static.cpuPerReq(), "static-cpu-us/req")
	if len(targets) > 2 {
		base := targets[2]
		b.ReportMetric(base.rate(), "base-req/s")
		b.ReportMetric(base.rate()/static.rate(), "base-x-static-req/s")
		b.ReportMetric(base.cpuPerReq(), "base-cpu-us/req")
		b.ReportMetric(ours.rate()/base.rate(), "x-base-req/s")
	}
}

// env holds the web certificate both kinds of server present.
type env struct {
	dir               string
	certFile, keyFile string
	tls               *tls.Config // the clients'
}

func newEnv(b *testing.B) *env {
	b.Helper()
	dir := b.TempDir()
	web := testca.New(b, "webpki.test")
	leaf, key := web.Issue(b, spiffeid.RequireFromString("spiffe://webpki.test/bundle-endpoint"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		b.Fatal(err)
	}
	e := &env{dir: dir, certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key")}
	writeFile(b, e.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}))
	writeFile(b, e.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	roots := x509.NewCertPool()
	roots.AddCert(web.Cert)
	e.tls = &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	return e
}

func writeFile(b *testing.B, path string, data []byte) {
	b.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		b.Fatal(err)
	}
}

var (
	bundleLine = regexp.MustCompile(`^\s+bundle:\s+https://[^/\s]*:(\d+)(/\S*)`)
	staticLine = regexp.MustCompile(`^listening 127\.0\.0\.1:(\d+)()$`)
)

// startTrustbridge runs `trustbridge server` on loopback with the
// https_web profile and the benchmark's certificate files, at log level
// warn, with no certificate service.
func (e *env) startTrustbridge(b *testing.B, name, bin string) *target {
	b.Helper()
	// An empty data directory needs no --init, which a build older than
	// it (TRUSTBRIDGE_BIN_BASE) would not know.
	dataDir := filepath.Join(e.dir, name)
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "server", "--trust-domain", trustDomain, "--data-dir", dataDir,
		"--admin-listen", "127.0.0.1:0", "--grpc-listen", "", "--bundle-listen", "127.0.0.1:0",
		"--bundle-profile", "https_web", "--bundle-tls-cert", e.certFile, "--bundle-tls-key", e.keyFile,
		"--log-level", "warn", "--log-format", "text") // text: the banner on stdout names the bundle URL
	return start(b, name, cmd, bundleLine, func() { _ = cmd.Process.Signal(syscall.SIGTERM) })
}

// startStatic runs the baseline process serving body.
func (e *env) startStatic(b *testing.B, body []byte) *target {
	b.Helper()
	bodyFile := filepath.Join(e.dir, "body.json")
	writeFile(b, bodyFile, body)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), staticEnv+"=1", staticCertEnv+"="+e.certFile, staticKeyEnv+"="+e.keyFile, staticBodyEnv+"="+bodyFile)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	return start(b, "static", cmd, staticLine, func() { _ = stdin.Close() })
}

// start starts cmd and reads its loopback port and path from the first
// stdout line that line matches; stop asks it to exit, and it is killed
// if it has not within 15s of the benchmark's end.
func start(b *testing.B, name string, cmd *exec.Cmd, line *regexp.Regexp, stop func()) *target {
	b.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr testlog.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	b.Cleanup(func() {
		stop()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			b.Errorf("%s server did not stop within 15s", name)
		}
	})
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := line.FindStringSubmatch(sc.Text()); m != nil && len(found) == 0 {
				found <- m
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	select {
	case m := <-found:
		return &target{name: name, pid: cmd.Process.Pid, url: "https://127.0.0.1:" + m[1] + m[2]}
	case <-time.After(30 * time.Second):
		b.Fatalf("%s server printed no address within 30s; stderr:\n%s", name, stderr.String())
	}
	return nil
}

// target is one server process and its clients' tallies.
type target struct {
	name    string
	pid     int
	url     string
	clients []*http.Client
	body    []byte

	requests int
	elapsed  time.Duration
	cpu      time.Duration
}

// fetchBody returns what the server serves, for the static server.
func (t *target) fetchBody(b *testing.B, cfg *tls.Config) []byte {
	b.Helper()
	tr := &http.Transport{TLSClientConfig: cfg.Clone()}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(t.url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: status %d, %v", t.url, resp.StatusCode, err)
	}
	return body
}

// reset zeroes the tallies and opens conns fresh keep-alive connections,
// each with one request, so that handshakes are not measured.
func (t *target) reset(b *testing.B, cfg *tls.Config, body []byte) {
	b.Helper()
	t.requests, t.elapsed, t.cpu, t.body = 0, 0, 0, body
	t.clients = make([]*http.Client, conns)
	for i := range t.clients {
		tr := &http.Transport{TLSClientConfig: cfg.Clone(), MaxIdleConnsPerHost: 1}
		b.Cleanup(tr.CloseIdleConnections)
		t.clients[i] = &http.Client{Transport: tr, Timeout: 10 * time.Second}
		if err := t.get(t.clients[i]); err != nil {
			b.Fatal(err)
		}
	}
}

func (t *target) get(c *http.Client) error {
	resp, err := c.Get(t.url)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || n != int64(len(t.body)) {
		return fmt.Errorf("%s %s: status %d, %d bytes, %v", t.name, t.url, resp.StatusCode, n, err)
	}
	return nil
}

// run makes n requests from all clients at once, timed on the benchmark's
// clock when timed is set.
func (t *target) run(b *testing.B, n int, timed bool) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(t.clients))
	cpu := cpuTime(b, t.pid)
	start := time.Now()
	if timed {
		b.StartTimer()
	}
	for _, c := range t.clients {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := t.get(c); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	if timed {
		b.StopTimer()
	}
	t.elapsed += time.Since(start)
	t.cpu += cpuTime(b, t.pid) - cpu
	t.requests += n
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

func (t *target) rate() float64 { return float64(t.requests) / t.elapsed.Seconds() }

func (t *target) cpuPerReq() float64 {
	return float64(t.cpu.Microseconds()) / float64(max(t.requests, 1))
}

// cpuTime is a process's user and system CPU time so far, from
// /proc/<pid>/stat (fields 14 and 15, in clock ticks of 10ms on Linux).
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("CPU time of %d: %v", pid, err)
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 13 {
		b.Fatalf("CPU time of %d: short /proc stat %q", pid, stat)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("CPU time of %d: /proc stat %q", pid, stat)
	}
	const tick = 10 * time.Millisecond // USER_HZ, 100 on every Linux ABI Go supports
	return time.Duration(utime+stime) * tick
}
