package attest

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// peerCred returns the peer of the connected unix socket fd: its pid (0
// when it is outside this pid namespace), uid and gid when it connected.
func peerCred(fd int) (pid int32, uid, gid uint32, err error) {
	u, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, 0, 0, err
	}
	return u.Pid, u.Uid, u.Gid, nil
}

// peerPidfd returns a pidfd for the process that connected to socket fd,
// taken by the kernel at connect (Linux 6.5). errNoPidfd: this kernel has
// no SO_PEERPIDFD.
func peerPidfd(fd int) (int, error) {
	pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if errors.Is(err, unix.ENOPROTOOPT) {
		return -1, errNoPidfd
	}
	return pidfd, err
}

// pidfdOpen opens a pidfd for pid now (Linux 5.3). errNoPidfd: this
// kernel has none.
func pidfdOpen(pid int32) (int, error) {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if errors.Is(err, unix.ENOSYS) {
		return -1, errNoPidfd
	}
	if err != nil {
		return -1, err
	}
	return fd, nil
}

// pidfdGone reports whether the process of pidfd has exited and been
// reaped (an exited one not yet reaped still holds its pid, and its stat
// says so). Signal 0 checks without signalling; EPERM means it exists.
func pidfdGone(pidfd int) (bool, error) {
	switch err := unix.PidfdSendSignal(pidfd, 0, nil, 0); {
	case err == nil, errors.Is(err, unix.EPERM):
		return false, nil
	case errors.Is(err, unix.ESRCH):
		return true, nil
	default:
		return false, err
	}
}

// preparePidfd makes pidfd close on exec, and non-blocking so that the
// runtime's poller can wait on it (a pidfd is readable once its process
// exited). Where it stays blocking, Caller.Exited polls instead.
func preparePidfd(fd int) {
	unix.CloseOnExec(fd)
	_ = unix.SetNonblock(fd, true)
}

// pidfdWait returns once the process of the pidfd f holds has exited: a
// pidfd polls readable then (Linux 5.3). f is non-blocking (pidfdFile),
// so rc.Read parks the goroutine on the runtime's poller between checks,
// not an OS thread in a blocking call; a pidfd the poller does not hold
// fails at once instead. It also returns, with an error, once f is
// closed.
func pidfdWait(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		// Only a check, never a wait: the poller waits.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			return false
		case err != nil:
			perr = err
			return true
		}
		return n > 0
	})
	if err != nil {
		return err
	}
	return perr
}
