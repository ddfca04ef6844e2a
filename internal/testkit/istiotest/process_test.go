package istiotest

import (
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// startProcess starts bin with args in dir, as name in messages, and
// stops it when the test ends: SIGTERM, then a kill and a test error
// after 15 s. Every line it writes, on stdout and stderr alike, must be a
// JSON record with unique keys (issue 22). read gets its stderr as it
// comes, with its pid, on a goroutine of its own; stderr keeps all of it
// for the test's log. exited is closed once the process has exited.
func startProcess(t testing.TB, name, bin, dir string, args []string, read func(r io.Reader, pid int)) (stderr *testlog.Buffer, exited <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	logs, err := cmd.StderrPipe()
	require.NoError(t, err)
	stderr = testlog.JSONLines(t)
	cmd.Stdout = testlog.JSONLines(t)
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s did not stop within 15s of SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, stderr.String())
		}
	})
	go func() {
		defer close(done)
		read(io.TeeReader(logs, stderr), cmd.Process.Pid)
		_, _ = io.Copy(stderr, logs)
		_ = cmd.Wait()
	}()
	return stderr, done
}
