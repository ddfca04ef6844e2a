// Package proctest stops the processes tests start: a server under test
// is asked to stop as it would be in production (SIGTERM), and a test
// whose server does not stop in time fails rather than leaving it behind.
package proctest

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// StopGrace is how long a process has to stop after SIGTERM.
const StopGrace = 15 * time.Second

// StopOnCleanup stops p when tb ends: SIGTERM, then it waits for exited
// (closed once the process has been waited for); past StopGrace it kills
// p, waits for exited, and fails tb, naming the process what.
func StopOnCleanup(tb testing.TB, p *os.Process, exited <-chan struct{}, what string) {
	tb.Cleanup(func() {
		_ = p.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(StopGrace):
			_ = p.Kill()
			<-exited
			tb.Errorf("%s did not stop within %s of SIGTERM", what, StopGrace)
		}
	})
}
