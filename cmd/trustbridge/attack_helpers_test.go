package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// attackTarget is a running server whose certificate service/SDS listener
// is attacked in the issue 14 regression tests and benchmarks: its gRPC
// and admin addresses and its log.
type attackTarget struct {
	grpc, admin string
	logs        *testlog.Buffer
}

// startAttackTarget runs a server with the certificate service on
// loopback and a bootstrap token for laptopID, as grpcServer does, but
// keeps its log and takes a testing.TB for benchmarks.
func startAttackTarget(tb testing.TB, mutate func(*server.Config)) *attackTarget {
	tb.Helper()
	tokens := filepath.Join(tb.TempDir(), "tokens.csv")
	require.NoError(tb, os.WriteFile(tokens, []byte(servertest.LaptopToken+","+servertest.LaptopID.String()+"\n"), 0o600))
	o := baseServerOptions("example.org", tb.TempDir())
	o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
	if mutate != nil {
		mutate(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	e, _, logs := testEnv(tb, o.LogFormat)
	at := &attackTarget{logs: logs}
	go func() {
		done <- runServer(ctx, e, o, ready)
	}()
	select {
	case at.admin = <-ready:
	case err := <-done:
		cancel()
		tb.Fatalf("server exited: %v\n%s", err, at.logs.String())
	}
	tb.Cleanup(func() {
		cancel()
		<-done
	})
	at.grpc = servertest.GRPCAddr(tb, logs.String())
	return at
}

// metric sums the samples of name whose labels contain every one of
// labels (`result="verified"`), as the admin listener serves them.
func (at *attackTarget) metric(tb testing.TB, name string, labels ...string) float64 {
	tb.Helper()
	return servertest.MetricVia(tb, http.DefaultClient, at.admin, name, labels...)
}

// logCount counts the log lines at level (JSON logs) containing msg.
func (at *attackTarget) logCount(level, msg string) int {
	n := 0
	for _, l := range strings.Split(at.logs.String(), "\n") {
		if strings.Contains(l, `"level":"`+level+`"`) && strings.Contains(l, msg) {
			n++
		}
	}
	return n
}
