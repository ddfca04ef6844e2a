package main

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
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
	require.NoError(tb, os.WriteFile(tokens, []byte(laptopToken+","+laptopID.String()+"\n"), 0o600))
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
	at.grpc = grpcAddr(tb, logs.String())
	return at
}

// metric sums the samples of name whose labels contain every one of
// labels (`result="verified"`), as the admin listener serves them.
func (at *attackTarget) metric(tb testing.TB, name string, labels ...string) float64 {
	tb.Helper()
	return metricVia(tb, http.DefaultClient, at.admin, name, labels...)
}

// metricVia is attackTarget.metric read through c from the admin
// listener at admin.
func metricVia(tb testing.TB, c *http.Client, admin, name string, labels ...string) float64 {
	tb.Helper()
	resp, err := c.Get("http://" + admin + "/metrics")
	require.NoError(tb, err)
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(tb, err)
		sum += v
	}
	require.NoError(tb, sc.Err())
	return sum
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
