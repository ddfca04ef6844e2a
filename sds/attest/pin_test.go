//go:build linux

package attest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// waiting starts a child that waits on its stdin, held open until the
// test ends, and returns it with a channel closed once it was reaped.
func waiting(t *testing.T, cred *syscall.Credential) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := child(t, "unused", "wait", cred)
	_, err := cmd.StdinPipe()
	require.NoError(t, err)
	return cmd, started(t, cmd)
}

// A process named by pid, not by a socket: pinned and attested as a
// socket's caller is, refused once it has exited.
func TestPinPID(t *testing.T) {
	a := newAttestor(t, Config{})
	cmd, reaped := waiting(t, nil)
	pid := int32(cmd.Process.Pid)

	c, err := a.PinPID(pid)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, pid, c.PID)
	assert.Equal(t, uint32(os.Geteuid()), c.UID)
	assert.Equal(t, uint32(os.Getegid()), c.GID)
	st, err := readStat("/proc", pid)
	require.NoError(t, err)
	assert.Equal(t, st.startTime, c.StartTime)
	assert.NotNil(t, c.pidfd, "pidfd_open")

	f, err := a.Attest(context.Background(), c)
	require.NoError(t, err)
	assert.Equal(t, pid, f.PID)
	assert.Equal(t, c.UID, f.Unix.UID)

	require.NoError(t, cmd.Process.Kill())
	<-reaped
	_, err = a.Attest(context.Background(), c)
	require.ErrorIs(t, err, ErrProcessReplaced)
	assert.Contains(t, err.Error(), "pid "+strconv.Itoa(int(pid))+" exited")
	assert.Equal(t, codes.PermissionDenied, status.Code(Status(err)))

	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "twice")
}

// A process running as another user: its effective IDs, from its status.
func TestPinPIDOtherUser(t *testing.T) {
	requireRoot(t)
	a := newAttestor(t, Config{})
	cmd, _ := waiting(t, &syscall.Credential{Uid: 4242, Gid: 4343})
	c, err := a.PinPID(int32(cmd.Process.Pid))
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, uint32(4242), c.UID)
	assert.Equal(t, uint32(4343), c.GID)
	f, err := a.Attest(context.Background(), c)
	require.NoError(t, err)
	assert.Equal(t, uint32(4242), f.Unix.UID)
	assert.Equal(t, uint32(4343), f.Unix.GID)
}

func TestPinPIDRefused(t *testing.T) {
	a := newAttestor(t, Config{})
	for _, pid := range []int32{0, -1} {
		_, err := a.PinPID(pid)
		require.ErrorIs(t, err, ErrInvalidPID)
		assert.Equal(t, codes.InvalidArgument, status.Code(Status(err)))
	}

	// Beyond pid_max no process is.
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	require.NoError(t, err)
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	_, err = a.PinPID(int32(max) + 1)
	require.ErrorIs(t, err, ErrProcessGone)
	assert.Contains(t, err.Error(), "pid "+strconv.Itoa(max+1))
	assert.Equal(t, codes.PermissionDenied, status.Code(Status(err)))

	// This process, seen through a /proc that has its stat but not its
	// status: refused, and says which file.
	pid := os.Getpid()
	root := fakeProc(t, pid, statLine(strconv.Itoa(pid), "attest.test", "S", "100"), "0::/\n")
	_, err = newAttestor(t, Config{ProcRoot: root}).PinPID(int32(pid))
	require.ErrorIs(t, err, ErrProcessGone)
	assert.Contains(t, err.Error(), filepath.Join(root, strconv.Itoa(pid), "status"))
}

// A process that exited but was not reaped still holds its pid: it is
// refused all the same.
func TestPinPIDZombie(t *testing.T) {
	cmd := child(t, "unused", "wait", nil)
	_, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Wait() })
	require.NoError(t, cmd.Process.Kill())
	var info unix.Siginfo
	require.NoError(t, unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil), "exited, left unreaped")

	_, err = newAttestor(t, Config{}).PinPID(int32(cmd.Process.Pid))
	require.ErrorIs(t, err, ErrProcessGone)
	assert.Contains(t, err.Error(), "exited")
}

// Exited is closed once the process exits, not while it runs: a zombie
// has exited, reaped or not.
func TestCallerExited(t *testing.T) {
	cmd := child(t, "unused", "wait", nil)
	_, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c, err := newAttestor(t, Config{}).PinPID(int32(cmd.Process.Pid))
	require.NoError(t, err)
	defer c.Close()
	exited := c.Exited()
	assert.Equal(t, exited, c.Exited(), "one channel")
	require.NoError(t, c.alive())
	assert.False(t, isClosed(exited), "the child runs")

	require.NoError(t, cmd.Process.Kill())
	var info unix.Siginfo
	require.NoError(t, unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil))
	<-exited
	require.Error(t, c.alive(), "an exited process is never attested")
}

// Close ends the watch: its channel is closed, the pidfd with it, and
// Attest refuses the Caller from then on.
func TestCallerCloseEndsWatch(t *testing.T) {
	a := newAttestor(t, Config{})
	c, err := a.PinPID(int32(os.Getpid()))
	require.NoError(t, err)
	exited := c.Exited()
	require.NoError(t, c.Close())
	<-exited
	_, err = a.Attest(context.Background(), c)
	require.ErrorIs(t, err, ErrProcessReplaced)
	assert.True(t, isClosed(c.Exited()))

	c, err = a.PinPID(int32(os.Getpid()))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.True(t, isClosed(c.Exited()), "closed before watching")
}

// A socket's Caller is its connection's: Close leaves its pidfd open, and
// the connection's end closes its watch.
func TestSocketCallerClose(t *testing.T) {
	p := &probe{a: newAttestor(t, Config{})}
	watched := make(chan (<-chan struct{}), 1)
	p.before = func(c *Caller) {
		assert.NoError(t, c.Close())
		watched <- c.Exited()
	}
	require.NoError(t, call(serve(t, p)))
	r := <-p.got
	require.NoError(t, r.err, "Close did not close the connection's pidfd")
	<-<-watched // closed with the connection, though this process runs on
}

// Waiting for exits holds no thread per waiter: each parks on the
// runtime's poller ("IO wait"), not in a blocking call.
func TestExitedParksOnPoller(t *testing.T) {
	const n = 128
	a := newAttestor(t, Config{})
	before := threads(t)
	callers := make([]*Caller, n)
	for i := range callers {
		c, err := a.PinPID(int32(os.Getpid()))
		require.NoError(t, err)
		require.NotNil(t, c.pidfd)
		callers[i] = c
		c.Exited()
	}
	awaitParked(t, n)
	assert.Less(t, threads(t)-before, n/4, "threads grew with the waiters")
	for _, c := range callers {
		require.NoError(t, c.Close())
		<-c.Exited()
	}
}

// awaitParked returns once n goroutines wait in pidfdWait on the poller;
// a goroutine's state is only visible by looking, so it looks until then.
func awaitParked(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(callTimeout)
	for {
		for {
			m := runtime.Stack(buf, true)
			if m < len(buf) {
				buf = buf[:m]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		parked := 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "[IO wait") && strings.Contains(g, "attest.pidfdWait") {
				parked++
			}
		}
		if parked >= n {
			return
		}
		require.True(t, time.Now().Before(deadline), "%d of %d waiters parked on the poller:\n%s", parked, n, buf)
		buf = buf[:cap(buf)]
		runtime.Gosched()
	}
}

// threads is this process's OS thread count.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no Threads: line in /proc/self/status")
	return 0
}

// Without a pidfd (kernels before 5.3) Exited polls, on synctest's clock:
// not closed while the child runs, however long, closed at the first
// poll after it exited.
func TestExitedPollsWithoutPidfd(t *testing.T) {
	cmd, reaped := waiting(t, nil)
	c, err := newAttestor(t, Config{}).PinPID(int32(cmd.Process.Pid))
	require.NoError(t, err)
	require.NoError(t, c.pidfd.Close())
	c.pidfd = nil
	synctest.Test(t, func(t *testing.T) {
		exited := c.Exited()
		time.Sleep(100 * exitPollInterval)
		synctest.Wait()
		assert.False(t, isClosed(exited), "the child runs")
		require.NoError(t, cmd.Process.Kill())
		<-reaped
		<-exited
		require.NoError(t, c.Close())
	})
}
