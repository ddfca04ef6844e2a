package servertest

import (
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// CountRecords is how many records of logs have message msg.
func CountRecords(logs, msg string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		if LogRecord(line, msg) != nil {
			n++
		}
	}
	return n
}

// EndpointURL is the bundle endpoint's URL, as the start-up record in a
// server's log names it.
func EndpointURL(t testing.TB, logs string) string {
	t.Helper()
	return LogAttr(t, logs, BundleEndpointStarted, "endpoint_url")
}

const BundleEndpointStarted = "bundle endpoint: peers federate with this tuple"

// GRPCAddr is the certificate service's address, as the start-up record
// in a server's log names it.
func GRPCAddr(tb testing.TB, logs string) string {
	tb.Helper()
	return LogAttr(tb, logs, "certificate service listening", "address")
}

// HUPAndWait sends SIGHUP and waits for the n-th record msg.
func HUPAndWait(t testing.TB, hup chan<- os.Signal, logs *testlog.Buffer, msg string, n int) {
	t.Helper()
	hup <- syscall.SIGHUP
	require.Eventually(t, func() bool { return CountRecords(logs.String(), msg) >= n },
		30*time.Second, 10*time.Millisecond, "no %d-th %q record:\n%s", n, msg, logs.String())
}

// LogAttr is the string attribute key of the record msg in logs.
func LogAttr(tb testing.TB, logs, msg, key string) string {
	tb.Helper()
	rec := LogRecord(logs, msg)
	require.NotNil(tb, rec, "no %q record in the log:\n%s", msg, logs)
	v, ok := rec[key].(string)
	require.True(tb, ok, "the %q record has no string %q:\n%v", msg, key, rec)
	return v
}

// LogRecord is the first record of logs (JSON lines; other lines are
// skipped) whose message is msg; nil when there is none.
func LogRecord(logs, msg string) map[string]any {
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			return rec
		}
	}
	return nil
}
