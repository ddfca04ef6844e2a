package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// gatedProxy forwards loopback TCP connections to backend once open is
// called; until then it holds them, unanswered: a CA that does not answer
// yet.
type gatedProxy struct {
	ln   net.Listener
	gate chan struct{}
	once sync.Once
}

func startGatedProxy(t *testing.T, backend string) *gatedProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &gatedProxy{ln: ln, gate: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); p.open(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				<-p.gate
				b, err := net.Dial("tcp", backend)
				if err != nil {
					return
				}
				defer b.Close()
				go func() { _, _ = io.Copy(b, c); _ = b.Close() }()
				_, _ = io.Copy(c, b)
			}()
		}
	}()
	return p
}

func (p *gatedProxy) open() { p.once.Do(func() { close(p.gate) }) }

// trustbridge agent --admin-listen: /readyz is 503 until the agent serves
// a certificate, then 200; /metrics serves the build info and the agent's
// metrics, every one documented; a foreign Host gets 421; SIGHUP is
// logged and ignored.
func TestAgentAdminListener(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	rootsPEM, err := os.ReadFile(rootCert)
	require.NoError(t, err)
	proxy := startGatedProxy(t, addr)
	o := agentFor(t, proxy.ln.Addr().String(), rootsPEM, servertest.LaptopToken)
	o.ServerID = "spiffe://example.org" + server.GRPCServingPath
	o.Admin.Listen = "127.0.0.1:0"

	e, _, logs := testEnv(t, o.LogFormat)
	hup := make(chan os.Signal, 1)
	e.HUP = hup
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runAgent(ctx, e, o) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done, "agent: clean shutdown")
	})
	var admin string
	require.Eventually(t, func() bool {
		rec := servertest.LogRecord(logs.String(), "admin listening")
		if rec == nil {
			return false
		}
		admin, _ = rec["address"].(string)
		return true
	}, 30*time.Second, 10*time.Millisecond, "the admin listener never started:\n%s", logs.String())

	code, body := servertest.Get(t, "http://"+admin+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "no certificate yet")
	assert.Contains(t, body, "not serving SDS yet")
	code, _ = servertest.Get(t, "http://"+admin+"/healthz")
	assert.Equal(t, http.StatusOK, code)

	proxy.open()
	require.Eventually(t, func() bool {
		code, _ := servertest.Get(t, "http://"+admin+"/readyz")
		return code == http.StatusOK
	}, 60*time.Second, 20*time.Millisecond, "never ready:\n%s", logs.String())

	code, body = servertest.Get(t, "http://"+admin+"/metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `trustbridge_build_info{goversion="`)
	for _, name := range []string{"trustbridge_agent_certificate_expiry_timestamp_seconds", "trustbridge_agent_certificate_requests_total", "trustbridge_agent_relay_connected"} {
		assert.Contains(t, body, "# TYPE "+name+" ", name)
	}
	assertDocumented(t, body)

	req, err := http.NewRequest(http.MethodGet, "http://"+admin+"/metrics", nil)
	require.NoError(t, err)
	req.Host = "attacker.example"
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "the server's Host check")

	hup <- syscall.SIGHUP
	require.Eventually(t, func() bool {
		return servertest.LogRecord(logs.String(), "SIGHUP ignored: nothing here is reloadable") != nil
	}, 30*time.Second, 10*time.Millisecond)
	code, _ = servertest.Get(t, "http://"+admin+"/readyz")
	assert.Equal(t, http.StatusOK, code, "still serving")
}

// assertDocumented checks every trustbridge_ metric of a /metrics body is
// in docs/metrics.md.
func assertDocumented(t *testing.T, body string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	require.NoError(t, err)
	documented := map[string]bool{}
	for _, m := range rowRe.FindAllSubmatch(doc, -1) {
		documented[string(m[1])] = true
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "# TYPE trustbridge_") {
			name := strings.Fields(line)[2]
			assert.True(t, documented[name], "%s is served but not in docs/metrics.md", name)
		}
	}
}
