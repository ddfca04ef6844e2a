package spiretest

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// process is a SPIRE binary running until stop.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once Wait returned
	err  error         // Wait's result, set before done is closed
}

func startProcess(logs *testlog.Buffer, bin string, args ...string) (*process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitFor polls ready until it succeeds, the process exits or timeout
// passes: SPIRE offers no readiness signal but its health check.
func (p *process) waitFor(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited: %v", p.err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("not ready within %s", timeout), err)
		}
	}
}

// stop asks the process to shut down, and kills it if it has not within
// 30 seconds. It returns once the process is gone.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
