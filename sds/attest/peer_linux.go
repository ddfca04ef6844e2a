package attest

import (
	"errors"

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

func closeOnExec(fd int) { unix.CloseOnExec(fd) }
