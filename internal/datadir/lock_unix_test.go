//go:build unix

package datadir

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holdEnv makes the test binary a lock holder: it locks the directory the
// variable names, prints "held", and keeps the lock until its standard
// input closes.
const holdEnv = "TRUSTBRIDGE_DATADIR_TEST_HOLD"

const holderCommand = "datadir test holder"

func TestMain(m *testing.M) {
	if dir := os.Getenv(holdEnv); dir != "" {
		os.Exit(hold(dir))
	}
	os.Exit(m.Run())
}

func hold(dir string) int {
	l, err := Acquire(dir, Self(holderCommand))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := l.Release(); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	return 0
}

// holder is a child process holding a directory's lock.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startHolder runs the test binary as a lock holder on dir and returns
// once it holds the lock.
func startHolder(t *testing.T, dir string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	h := &holder{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		_ = stdin.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", line)
	return h
}

// stop lets the holder release the lock and exit, and waits for it.
func (h *holder) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, h.stdin.Close())
	require.NoError(t, h.cmd.Wait())
}

// kill crashes the holder: SIGKILL, no chance to release anything.
func (h *holder) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGKILL))
	err := h.cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
}

func readRecord(t *testing.T, dir string) Holder {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, LockName))
	require.NoError(t, err)
	h, err := ParseHolder(data)
	require.NoError(t, err)
	return h
}

// A second process is refused at once, with the holder named; once the
// holder exits, the lock is free.
func TestSecondProcessIsRefusedWithTheHolderNamed(t *testing.T) {
	dir := t.TempDir()
	child := startHolder(t, dir)
	pid := child.cmd.Process.Pid

	_, err := Acquire(dir, Self("second"))
	require.ErrorIs(t, err, ErrHeld)
	var held *HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, pid, held.Holder.PID)
	assert.Equal(t, holderCommand, held.Holder.Command)
	host, _ := os.Hostname()
	assert.Equal(t, host, held.Holder.Host)
	assert.False(t, held.Holder.Started.IsZero())
	assert.ErrorContains(t, err, dir+" is in use by another trustbridge: pid "+strconv.Itoa(pid)+" on host "+host+" ("+holderCommand+"), started ")
	assert.ErrorContains(t, err, "holds its lock "+filepath.Join(dir, LockName))
	assert.ErrorContains(t, err, "stop that one first, or give this one a data directory of its own")
	assert.Equal(t, pid, readRecord(t, dir).PID, "the refused process left the holder's record alone")

	h, isHeld, err := Probe(dir)
	require.NoError(t, err)
	assert.True(t, isHeld)
	assert.Equal(t, pid, h.PID)

	child.stop(t)
	assert.Zero(t, readRecord(t, dir), "a clean release empties the record")
	_, isHeld, err = Probe(dir)
	require.NoError(t, err)
	assert.False(t, isHeld)

	l, err := Acquire(dir, Self("second"))
	require.NoError(t, err)
	assert.Equal(t, os.Getpid(), readRecord(t, dir).PID)
	require.NoError(t, l.Release())
}

// A holder that crashes (SIGKILL) releases the lock all the same: the
// kernel drops it with the process. Its record stays in the file and does
// not block the next server, which overwrites it.
func TestLockIsReleasedWhenTheHolderIsKilled(t *testing.T) {
	dir := t.TempDir()
	child := startHolder(t, dir)
	pid := child.cmd.Process.Pid
	child.kill(t)

	assert.Equal(t, pid, readRecord(t, dir).PID, "the dead holder's record is still there")
	_, isHeld, err := Probe(dir)
	require.NoError(t, err)
	assert.False(t, isHeld, "nobody holds the lock")

	l, err := Acquire(dir, Self("next"))
	require.NoError(t, err)
	defer l.Release()
	rec := readRecord(t, dir)
	assert.Equal(t, os.Getpid(), rec.PID)
	assert.Equal(t, "next", rec.Command)
}

// Only a held lock blocks, never the file's content: records naming a
// dead process, a live process that holds nothing, or nothing readable.
func TestStaleLockFileDoesNotBlock(t *testing.T) {
	for _, tc := range []struct{ name, content string }{
		{"live process that holds nothing", fmt.Sprintf(`{"pid":%d,"started":"2026-11-24T10:00:00Z","command":"trustbridge server"}`, os.Getppid())},
		{"garbage", "not a record"},
		{"empty", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, LockName), []byte(tc.content), 0o600))
			l, err := Acquire(dir, Self("fresh"))
			require.NoError(t, err)
			assert.Equal(t, os.Getpid(), readRecord(t, dir).PID)
			require.NoError(t, l.Release())
		})
	}
}

// The lock is per open file, so a second Acquire in the same process is
// refused as well, naming this process.
func TestSecondAcquireInOneProcessIsRefused(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir, Self("first"))
	require.NoError(t, err)
	_, err = Acquire(dir, Self("second"))
	var held *HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, os.Getpid(), held.Holder.PID)
	assert.Equal(t, "first", held.Holder.Command)
	require.NoError(t, l.Release())
	require.NoError(t, l.Release(), "releasing twice is harmless")

	l, err = Acquire(dir, Self("third"))
	require.NoError(t, err)
	require.NoError(t, l.Release())
}

// A lock held by a process that has not recorded itself (Probe's brief
// shared lock, a server between locking and writing its record) is
// waited out; one that stays so is refused without naming anyone.
func TestAcquireWaitsOutAnUnrecordedHolder(t *testing.T) {
	dir := t.TempDir()
	probe := func() *os.File {
		require.NoError(t, os.WriteFile(filepath.Join(dir, LockName), nil, 0o600))
		f, err := openForProbe(filepath.Join(dir, LockName))
		require.NoError(t, err)
		held, err := tryLock(f, false)
		require.NoError(t, err)
		require.False(t, held)
		return f
	}

	f := probe()
	waits := 0
	l, err := acquire(dir, Self("server"), 3, func() {
		waits++
		require.NoError(t, f.Close()) // the probe is done
	})
	require.NoError(t, err)
	assert.Equal(t, 1, waits)
	require.NoError(t, l.Release())

	f = probe()
	defer f.Close()
	waits = 0
	_, err = acquire(dir, Self("server"), 3, func() { waits++ })
	var held *HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, 3, waits)
	assert.Zero(t, held.Holder)
	assert.ErrorContains(t, err, "a process that has not recorded itself in the lock file holds its lock")
}

func TestLockFileIsPrivateAndNotASymlink(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir, Self("server"))
	require.NoError(t, err)
	info, err := os.Stat(l.Path())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	require.NoError(t, l.Release())
	_, err = os.Stat(l.Path())
	assert.NoError(t, err, "the file stays after release")

	dir = t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere")
	require.NoError(t, os.WriteFile(target, []byte("keep"), 0o600))
	require.NoError(t, os.Symlink(target, filepath.Join(dir, LockName)))
	_, err = Acquire(dir, Self("server"))
	require.Error(t, err)
	assert.True(t, errors.Is(err, syscall.ELOOP), "%v", err)
	data, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, "keep", string(data))
}

// Probe creates nothing where there is no lock file, and refuses none.
func TestProbeCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	_, isHeld, err := Probe(dir)
	require.NoError(t, err)
	assert.False(t, isHeld)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)

	_, _, err = Probe(filepath.Join(dir, "missing"))
	assert.NoError(t, err)
	_, err = Acquire(filepath.Join(dir, "missing"), Self("server"))
	assert.ErrorIs(t, err, os.ErrNotExist, "Acquire does not create the directory")
	assert.False(t, strings.Contains(fmt.Sprint(err), "in use"))
}

// A crashed server's record naming this process's pid and host (pid 1 of
// a restarted container) is not a live holder: while a Probe holds the
// lock for a moment, Acquire waits it out instead of refusing, naming
// itself as the holder.
func TestOwnPIDInAStaleRecordIsNotALiveHolder(t *testing.T) {
	dir := t.TempDir()
	host, _ := os.Hostname()
	stale := fmt.Sprintf(`{"pid":%d,"host":%q,"started":"2026-11-24T10:00:00Z","command":"trustbridge server"}`, os.Getpid(), host)
	require.NoError(t, os.WriteFile(filepath.Join(dir, LockName), []byte(stale), 0o600))
	probe, err := openForProbe(filepath.Join(dir, LockName))
	require.NoError(t, err)
	held, err := tryLock(probe, false)
	require.NoError(t, err)
	require.False(t, held)

	waits := 0
	l, err := acquire(dir, Self("server"), 3, func() {
		waits++
		require.NoError(t, probe.Close()) // the probe is done
	})
	require.NoError(t, err, "the stale record names this process, which holds nothing")
	assert.Equal(t, 1, waits)
	assert.Equal(t, "server", readRecord(t, dir).Command)
	require.NoError(t, l.Release())
}
