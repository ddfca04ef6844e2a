package main

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"

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
