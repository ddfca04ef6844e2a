package main

import (
	"strings"
	"testing"
	"time"

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
