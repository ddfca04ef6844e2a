package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// testEnv is the env a test runs a server or an agent in, logging in
// format: with "json", standard output and the log are checked line by
// line (testlog.JSONLines), so every record the e2e tests make is JSON
// with unique keys, and nothing else reaches a log pipeline.
func testEnv(tb testing.TB, format string) (e cli.Env, out, logs *testlog.Buffer) {
	out, logs = &testlog.Buffer{}, &testlog.Buffer{}
	if format == "json" {
		out, logs = testlog.JSONLines(tb), testlog.JSONLines(tb)
	}
	return cli.Env{In: strings.NewReader(""), Out: out, Err: logs, Now: time.Now}, out, logs
}

// logRecord is the first record of logs (JSON lines; other lines are
// skipped) whose message is msg; nil when there is none.
func logRecord(logs, msg string) map[string]any {
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			return rec
		}
	}
	return nil
}

// logAttr is the string attribute key of the record msg in logs.
func logAttr(tb testing.TB, logs, msg, key string) string {
	tb.Helper()
	rec := logRecord(logs, msg)
	require.NotNil(tb, rec, "no %q record in the log:\n%s", msg, logs)
	v, ok := rec[key].(string)
	require.True(tb, ok, "the %q record has no string %q:\n%v", msg, key, rec)
	return v
}
