package main

import (
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// getWithHost GETs url with the Host header set to host, as a browser
// does for a page whose name was rebound to the server's address.
func getWithHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// DNS rebinding against a real server on loopback: a page on
// evil.example whose name now resolves to 127.0.0.1 gets 421 and nothing
// of the snapshot; the server's own address, localhost and a listed name
// are served.
func TestAdminRefusesRebindingHost(t *testing.T) {
	addr, _ := startServer(t, t.TempDir(), func(o *server.Config) {
		o.AdminHosts = []string{"trustbridge-admin.trustbridge-system.svc"}
	})
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	url := "http://" + addr + "/v1/snapshot"

	for _, host := range []string{"evil.example", "evil.example:" + port, "127.0.0.1.evil.example:" + port, "10.0.0.1:" + port} {
		code, body := getWithHost(t, url, host)
		assert.Equal(t, http.StatusMisdirectedRequest, code, host)
		assert.Contains(t, body, "--admin-allowed-hosts", host)
		assert.NotContains(t, body, "example.org", "nothing of the snapshot is served")
	}
	for _, path := range []string{"/v1/trust", "/v1/federation", "/ui", "/metrics"} {
		code, _ := getWithHost(t, "http://"+addr+path, "evil.example:"+port)
		assert.Equal(t, http.StatusMisdirectedRequest, code, path)
	}

	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "trustbridge-admin.trustbridge-system.svc:" + port} {
		code, body := getWithHost(t, url, host)
		assert.Equal(t, http.StatusOK, code, host)
		assert.Contains(t, body, `"example.org"`, host)
	}
	// Each refusal is counted, so an operator whose probe uses an unlisted
	// name sees why.
	_, metrics := getWithHost(t, "http://"+addr+"/metrics", "127.0.0.1:"+port)
	assert.Contains(t, metrics, "trustbridge_admin_misdirected_requests_total 8\n")

	// The CLI reaches it by address, as before.
	out, stderr, code := runCLI(t, "", "audit", "--admin", "http://"+addr, "--fail-on", "none")
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "trust domain example.org")
}

func TestConfigCheckAdminAllowedHosts(t *testing.T) {
	t.Setenv("TRUST_DOMAIN", "")
	good := servertest.WriteConfig(t, "trust-domain: east.example\nadmin-allowed-hosts: [trustbridge-admin.trustbridge-system.svc, admin.example:8080]\n")
	out, stderr, code := runCLI(t, "", "config", "check", good)
	assert.Equal(t, 0, code, stderr)
	assert.Equal(t, good+": ok\n", out)

	bad := servertest.WriteConfig(t, "trust-domain: east.example\nadmin-allowed-hosts: [\"https://admin.example/\"]\n")
	out, _, code = runCLI(t, "", "config", "check", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, `--admin-allowed-hosts: hostcheck: allowed host "https://admin.example/"`)
}
