package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// launchReloadable runs a server with o whose SIGHUP is the returned
// channel, and returns its admin address and live log.
func launchReloadable(t *testing.T, o server.Config) (admin string, hup chan<- os.Signal, logs *testlog.Buffer) {
	t.Helper()
	e, _, logs := testEnv(t, o.LogFormat)
	ch := make(chan os.Signal, 1)
	e.HUP = ch
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runServer(ctx, e, o, ready) }()
	select {
	case admin = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("server exited: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done, "clean shutdown")
	})
	return admin, ch, logs
}

// countRecords is how many records of logs have message msg.
func countRecords(logs, msg string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		if logRecord(line, msg) != nil {
			n++
		}
	}
	return n
}

// hupAndWait sends SIGHUP and waits for the n-th record msg.
func hupAndWait(t *testing.T, hup chan<- os.Signal, logs *testlog.Buffer, msg string, n int) {
	t.Helper()
	hup <- syscall.SIGHUP
	require.Eventually(t, func() bool { return countRecords(logs.String(), msg) >= n },
		30*time.Second, 10*time.Millisecond, "no %d-th %q record:\n%s", n, msg, logs.String())
}

func federated(t *testing.T, admin string) []string {
	t.Helper()
	return federatedSequences(t, admin, nil)
}

func webPeers(tds ...string) string {
	var b strings.Builder
	b.WriteString("federation:\n")
	for _, td := range tds {
		// Loopback, nothing listening: polls fail without leaving the host.
		fmt.Fprintf(&b, "  - trustDomain: %s\n    bundleEndpointURL: https://127.0.0.1:1/%s\n    bundleEndpointProfile:\n      type: https_web\n", td, td)
	}
	return b.String()
}
