package grpcslog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/grpclog"
)

// Installed once for the package's tests, before any grpc call.
var installed = New()

func init() { grpclog.SetLoggerV2(installed) }

func records(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal(line, &m), "not JSON: %q", line)
		out = append(out, m)
	}
	return out
}

func TestLevels(t *testing.T) {
	tests := []struct {
		name      string
		minLevel  slog.Level
		log       func(*Logger)
		wantLevel string // "" means nothing written
		wantMsg   string
	}{
		{"error", slog.LevelInfo, func(g *Logger) { g.Errorf("dial %s: %v", "x", "refused") }, "ERROR", "dial x: refused"},
		{"errorln", slog.LevelInfo, func(g *Logger) { g.Errorln("a", "b") }, "ERROR", "a b"},
		{"warning hidden at info", slog.LevelInfo, func(g *Logger) { g.Warning("w") }, "", ""},
		{"warning at debug", slog.LevelDebug, func(g *Logger) { g.Warningf("w%d", 1) }, "DEBUG", "w1"},
		{"info hidden at info", slog.LevelInfo, func(g *Logger) { g.Infoln("i") }, "", ""},
		{"info at debug", slog.LevelDebug, func(g *Logger) { g.Info("i", 2) }, "DEBUG", "i2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			g := New()
			g.Set(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: tt.minLevel})))
			tt.log(g)
			recs := records(t, &buf)
			if tt.wantLevel == "" {
				assert.Empty(t, recs)
				return
			}
			require.Len(t, recs, 1)
			assert.Equal(t, tt.wantLevel, recs[0]["level"])
			assert.Equal(t, tt.wantMsg, recs[0]["msg"])
		})
	}
}

func TestFatalExits(t *testing.T) {
	var buf bytes.Buffer
	var code int
	g := New()
	g.exit = func(c int) { code = c }
	g.Set(slog.New(slog.NewJSONHandler(&buf, nil)))
	g.Fatalf("boom %d", 1)
	assert.Equal(t, 1, code)
	recs := records(t, &buf)
	require.Len(t, recs, 1)
	assert.Equal(t, "boom 1", recs[0]["msg"])
}

func TestUnsetDiscards(t *testing.T) {
	g := New()
	assert.NotPanics(t, func() { g.Error("nobody listens") })
	assert.True(t, g.V(0))
	assert.False(t, g.V(2))
}

// TestThroughGRPCLog: grpc's component loggers reach the slog logger as
// JSON, and a later Set takes over.
func TestThroughGRPCLog(t *testing.T) {
	var first, second bytes.Buffer
	installed.Set(slog.New(slog.NewJSONHandler(&first, nil)))
	t.Cleanup(func() { installed.Set(nil) })
	c := grpclog.Component("core")
	c.Errorf("transport failed: %s", "eof")
	installed.Set(slog.New(slog.NewJSONHandler(&second, nil)))
	c.Error("again")

	recs := records(t, &first)
	require.Len(t, recs, 1)
	assert.Equal(t, "ERROR", recs[0]["level"])
	assert.Contains(t, recs[0]["msg"], "transport failed: eof")
	recs = records(t, &second)
	require.Len(t, recs, 1)
	assert.Contains(t, recs[0]["msg"], "again")
}
