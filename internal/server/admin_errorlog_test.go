package server

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// TestAdminServerErrorLogJSON: net/http's own errors on the admin
// listener (here a handler's panic) come out as JSON records of the
// process's logger, not as plain text through the log package.
func TestAdminServerErrorLogJSON(t *testing.T) {
	logs := testlog.JSONLines(t)
	logger, err := NewLogger(logs, "json", "info")
	require.NoError(t, err)
	srv := NewAdminServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }), logger)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })

	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err == nil {
		resp.Body.Close()
	}
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		var found map[string]any
		for _, line := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && strings.Contains(rec["msg"].(string), "panic serving") {
				found = rec
			}
		}
		if assert.NotNil(c, found, "no JSON record of the panic in %q", logs.String()) {
			assert.Equal(c, "WARN", found["level"])
			assert.Contains(c, found["msg"], "boom")
		}
	}, 10*time.Second, 10*time.Millisecond)
}
