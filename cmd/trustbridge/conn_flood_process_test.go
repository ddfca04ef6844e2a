package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// binEnv names the trustbridge binary the process-level tests run: make
// unit sets it to bin/trustbridge, the build users run, without the race
// detector, so that the memory measured is the server's own.
const binEnv = "TRUSTBRIDGE_BIN"

// binServer is bin/trustbridge server in a process of its own.
type binServer struct {
	pid                 int
	grpc, bundle, admin string // host:port
}

// startBinServer runs `trustbridge server` with args beside a fresh data
// directory and loopback listeners, and reads its listeners from its JSON
// start-up record. It is stopped with SIGTERM when the test ends.
func startBinServer(t *testing.T, bin string, args ...string) *binServer {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"server", "--trust-domain", "example.org", "--data-dir", filepath.Join(dir, "data"), "--init",
		"--grpc-listen", "127.0.0.1:0", "--bundle-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
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
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "trustbridge server started" {
				started <- rec.Listeners
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("trustbridge server did not stop within 15s of SIGTERM")
		}
	})
	select {
	case l := <-started:
		s := &binServer{pid: cmd.Process.Pid, grpc: l["grpc"], bundle: l["bundle"], admin: l["admin"]}
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
// ends and, under make test, inflated by the race detector). First one
// address floods every listener: each keeps that address's limit, and a
// client from another address is served on all three. Then more addresses
// fill every listener to its total: the excess is refused as total_limit,
// and the server, holding the most connections its default limits allow,
// stays under the manifests' memory limit. Deadlines that would close
// idle connections are set beyond the test, so the worst case is held.
func TestConnectionFloodServerMemory(t *testing.T) {
	bin := os.Getenv(binEnv)
	if bin == "" {
		t.Skipf("%s is unset: make unit sets it to bin/trustbridge (go build ./cmd/trustbridge)", binEnv)
	}
	listeners := []listenerLimits{grpcLimits, bundleLimits, adminLimits}
	most := 0
	for _, l := range listeners {
		most += l.def.max
	}
	needOpenFiles(t, uint64(most+1024))
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(laptopToken+","+laptopID.String()+"\n"), 0o600))
	s := startBinServer(t, bin, "--bootstrap-token-file", tokens, "--grpc-first-call-timeout", "1h", "--bundle-idle-timeout", "1h")
	limit := manifestMemoryLimit(t)
	rssIdle := s.rss(t)
	kinds := []floodKind{floodH2, floodH2, floodHTTP}
	addrs := []string{s.grpc, s.bundle, s.admin}

	// One address.
	held := 0
	for i, l := range listeners {
		conns, refused := flood(t, addrs[i], "127.0.0.1", kinds[i], 2*l.def.perSource)
		assert.Equal(t, l.def.perSource, len(conns), "%s: the source's limit, and not one more", l.name)
		assert.Equal(t, l.def.perSource, refused, "%s: the rest refused", l.name)
		held += len(conns)
	}
	c := fromClient("127.0.0.2")
	code, body := getFrom(t, c, "https://"+s.bundle+"/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"keys"`)
	code, _ = getFrom(t, c, "http://"+s.admin+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	csr, _ := csrFor(t, laptopID)
	cc := dialConn(t, s.grpc, "127.0.0.2", nil)
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(withBearer(context.Background(), laptopToken),
		&securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	require.NoError(t, err, "a client from another address is served during the flood")
	assert.NotEmpty(t, resp.GetCertChain())
	rssOne := s.rss(t)
	for _, l := range listeners {
		assert.EqualValues(t, l.def.perSource, metricVia(t, c, s.admin, "trustbridge_listener_connections_refused_total", `listener="`+l.name+`"`, `reason="source_limit"`), l.name)
	}
	require.NoError(t, cc.Close())
	c.CloseIdleConnections()

	// Enough addresses to fill every listener, and one connection more.
	// The metrics are read over one kept-alive connection from an address
	// of its own, opened before the admin listener fills.
	m := fromClient("127.0.0.252")
	t.Cleanup(m.CloseIdleConnections)
	for i, l := range listeners {
		for src := 3; ; src++ {
			open := metricVia(t, m, s.admin, "trustbridge_listener_connections_open", `listener="`+l.name+`"`)
			if int(open) >= l.def.max {
				break
			}
			require.Less(t, src, 250, "%s never filled", l.name)
			conns, _ := flood(t, addrs[i], "127.0.0."+strconv.Itoa(src), kinds[i], l.def.perSource)
			held += len(conns)
		}
		conns, refused := flood(t, addrs[i], "127.0.0.251", kinds[i], 1)
		assert.Empty(t, conns, "%s: over its total", l.name)
		assert.Equal(t, 1, refused, l.name)
		assert.Positive(t, metricVia(t, m, s.admin, "trustbridge_listener_connections_refused_total", `listener="`+l.name+`"`, `reason="total_limit"`), l.name)
	}
	rssFull := s.rss(t)
	t.Logf("server RSS: %d MiB idle, %d MiB with one address's flood, %d MiB holding %d connections (every listener full); limit %d MiB",
		rssIdle>>20, rssOne>>20, rssFull>>20, held, limit>>20)
	assert.Less(t, rssOne, limit)
	assert.Less(t, rssFull, limit, "the most connections the default limits allow fit the manifests' memory limit")
}
