package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// launchServer runs runServer with o until the returned stop (or the end
// of the test) and returns the admin address and what it wrote until it
// served: the start-up records (logRecord), after the banner when o logs
// text.
func launchServer(t *testing.T, o Config) (admin, banner string, stop func()) {
	t.Helper()
	e, out, logs := testEnv(t, o.LogFormat)
	admin, stop = servertest.Launch(t, o.TrustDomain, logs, func(ctx context.Context, ready chan<- string) error {
		return runServer(ctx, e, o, ready)
	})
	return admin, out.String() + logs.String(), stop
}

// baseServerOptions is a server for td on dataDir with the defaults of the
// flags and loopback listeners; the bundle endpoint is off.
func baseServerOptions(td, dataDir string) Config {
	return Config{
		TrustDomain: td, DataDir: dataDir, AdminListen: "127.0.0.1:0",
		KeyType: "ec-p256", CATTL: 8760 * time.Hour, WorkloadTTL: 24 * time.Hour,
		MaxWorkloadTTL: 90 * 24 * time.Hour, RefreshHint: 5 * time.Minute, LogFormat: "json", LogLevel: "info",
		Federation: FederationConfig{MinRefresh: federation.DefaultMinRefresh, MaxRefresh: federation.DefaultMaxRefresh,
			Timeout: 5 * time.Second},
	}
}

func startServer(t *testing.T, dataDir string, mutate ...func(*Config)) (string, *bytes.Buffer) {
	t.Helper()
	o := baseServerOptions("example.org", dataDir)
	for _, m := range mutate {
		m(&o)
	}
	admin, banner, _ := launchServer(t, o)
	return admin, bytes.NewBufferString(banner)
}

func TestServerAdminEndpoints(t *testing.T) {
	dataDir := t.TempDir()
	started := time.Now()
	addr, out := startServer(t, dataDir)
	assert.Equal(t, "example.org", servertest.LogAttr(t, out.String(), "trustbridge server started", "trust_domain"))
	assert.Equal(t, "http://"+addr, servertest.LogAttr(t, out.String(), "trustbridge server started", "admin"))
	assert.Equal(t, "self-signed, state in "+filepath.Join(dataDir, "ca")+", keys in files there (mode 0600)",
		servertest.LogAttr(t, out.String(), "trustbridge server started", "ca"))

	code, body := servertest.Get(t, "http://"+addr+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)
	code, _ = servertest.Get(t, "http://"+addr+"/readyz")
	assert.Equal(t, http.StatusOK, code)

	code, body = servertest.Get(t, "http://"+addr+"/v1/trust")
	require.Equal(t, http.StatusOK, code)
	var doc servertest.TrustDoc
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	assert.Equal(t, "example.org", doc.TrustDomain)
	// The first sequence is the bootstrap time in Unix seconds.
	assert.GreaterOrEqual(t, doc.Sequence, uint64(started.Unix()))
	assert.LessOrEqual(t, doc.Sequence, uint64(time.Now().Unix()))
	assert.Equal(t, int64(300), doc.RefreshHintSeconds)
	require.Len(t, doc.Authorities, 1)
	assert.Equal(t, "active", doc.Authorities[0].State)
	assert.Len(t, doc.Authorities[0].SHA256, 64)

	code, body = servertest.Get(t, "http://"+addr+"/metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `trustbridge_ca_root_not_after_timestamp_seconds{root_id="`)
	assert.Contains(t, body, `trustbridge_ca_bundle_sequence{trust_domain="example.org"} `+strconv.FormatFloat(float64(doc.Sequence), 'g', -1, 64)+"\n")
	assert.Contains(t, body, `trustbridge_ca_not_ready{trust_domain="example.org"} 0`)

	resp, err := http.Post("http://"+addr+"/v1/trust", "application/json", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}
