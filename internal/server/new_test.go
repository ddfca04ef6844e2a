package server

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// New fills what the process would give: a server built from flags alone
// writes nowhere and reads the real clock.
func TestNewDefaults(t *testing.T) {
	s := New(Config{})
	assert.NotNil(t, s.cfg.Stdout)
	assert.NotNil(t, s.cfg.Stderr)
	require.NotNil(t, s.cfg.Now)
	assert.WithinDuration(t, time.Now(), s.cfg.Now(), time.Minute)
	assert.Equal(t, "v1.2.3", Config{Version: "v1.2.3"}.version())
	assert.Equal(t, buildVersion(), Config{}.version())
}

// Run serves with Config's streams, clock, version and Ready, as
// trustbridge server runs it, and stops cleanly when its context ends.
func TestRunThroughConfig(t *testing.T) {
	var logs testlog.Buffer
	ready := make(chan string, 1)
	cfg := baseServerOptions("example.org", t.TempDir())
	cfg.Stderr, cfg.Ready, cfg.Version = &logs, ready, "v9.9.9-test"
	cfg.Now = func() time.Time { return time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(cfg).Run(ctx) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("server exited: %v\n%s", err, logs.String())
	}
	code, body := servertest.Get(t, "http://"+addr+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)
	_, metrics := servertest.Get(t, "http://"+addr+"/metrics")
	assert.Contains(t, metrics, `trustbridge_build_info{goversion=`)
	assert.Contains(t, metrics, `version="v9.9.9-test"`)
	_, snap := servertest.Get(t, "http://"+addr+"/v1/snapshot")
	var doc struct {
		Time time.Time `json:"time"`
	}
	if assert.NoError(t, json.Unmarshal([]byte(snap), &doc), snap) {
		assert.Equal(t, cfg.Now(), doc.Time.UTC(), "snapshots are dated by Config.Now")
	}
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, "v9.9.9-test", servertest.LogAttr(t, logs.String(), "trustbridge server started", "version"))
}
