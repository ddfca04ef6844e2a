package servertest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Launch runs run in the background until the returned stop (or the end
// of the test) and returns the address run sent on ready. name names the
// server in failures; logs returns what it logged so far, printed when it
// exits before it serves. stop cancels run's context and asserts a clean
// shutdown; it runs once.
func Launch(tb testing.TB, name string, logs fmt.Stringer, run func(ctx context.Context, ready chan<- string) error) (addr string, stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, ready) }()
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		tb.Fatalf("%s server exited: %v\n%s", name, err, logs.String())
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			assert.NoError(tb, <-done, "%s server: clean shutdown", name)
		})
	}
	tb.Cleanup(stop)
	return addr, stop
}
