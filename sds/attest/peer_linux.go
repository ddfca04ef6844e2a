package attest

import (
	"errors"
	"syscall"
)

// Linux's numbers that package syscall does not name. The pidfd system
// calls have one number on every architecture Go supports (new system
// calls share the generic table since Linux 5.1); SO_PEERPIDFD differs
// only on sparc64, which Go does not support.
const (
	soPeerPidfd        = 0x4d
	sysPidfdSendSignal = 424
	sysPidfdOpen       = 434
)

// peerCred returns the peer of the connected unix socket fd: its pid (0
// when it is outside this pid namespace), uid and gid when it connected.
func peerCred(fd int) (pid int32, uid, gid uint32, err error) {
	u, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil {
		return 0, 0, 0, err
	}
	return u.Pid, u.Uid, u.Gid, nil
}

// peerPidfd returns a pidfd for the process that connected to socket fd,
// taken by the kernel at connect (Linux 6.5). errNoPidfd: this kernel has
// no SO_PEERPIDFD.
func peerPidfd(fd int) (int, error) {
	pidfd, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, soPeerPidfd)
	if errors.Is(err, syscall.ENOPROTOOPT) {
		return -1, errNoPidfd
	}
	return pidfd, err
}

// pidfdOpen opens a pidfd for pid now (Linux 5.3). errNoPidfd: this
// kernel has none.
func pidfdOpen(pid int32) (int, error) {
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	switch {
	case errno == syscall.ENOSYS:
		return -1, errNoPidfd
	case errno != 0:
		return -1, errno
	}
	return int(fd), nil
}

// pidfdGone reports whether the process of pidfd has exited and been
// reaped (an exited one not yet reaped still holds its pid, and its stat
// says so). Signal 0 checks without signalling; EPERM means it exists.
func pidfdGone(pidfd int) (bool, error) {
	_, _, errno := syscall.Syscall6(sysPidfdSendSignal, uintptr(pidfd), 0, 0, 0, 0, 0)
	switch errno {
	case 0, syscall.EPERM:
		return false, nil
	case syscall.ESRCH:
		return true, nil
	default:
		return false, errno
	}
}

func closeOnExec(fd int) { syscall.CloseOnExec(fd) }
