package attest

import (
	"errors"
)

// PinPID pins the process pid names now, for a third party (a broker
// such as ztunnel) that names a workload by pid rather than connecting
// as it: a pidfd for it (pidfd_open; where the kernel has none, its start
// time alone, as for a socket's caller), its start time, and its
// effective uid and gid from /proc/<pid>/status. Attest then reads its
// facts and re-checks the pin as for a socket's caller, and Exited tells
// when it ends. pid is in the agent's pid namespace (the host's).
//
// Whoever names the pid vouches that it names the workload meant:
// PinPID pins whatever process holds it at the call. A pid of zero or
// less is refused wrapping ErrInvalidPID; one no process holds, or whose
// process exited, wrapping ErrProcessGone. Close the Caller when done
// with it.
func (a *Attestor) PinPID(pid int32) (*Caller, error) {
	if pid <= 0 {
		return nil, refusal(ErrInvalidPID, "pid %d: a process is named by a positive pid", pid)
	}
	c := &Caller{PID: pid, procRoot: a.cfg.ProcRoot, owned: true}
	fd, err := pidfdOpen(pid)
	switch {
	case err == nil:
		c.pidfd = pidfdFile(fd, pid)
	case errors.Is(err, errNoPidfd):
	default:
		return nil, refusal(ErrProcessGone, "pid %d: pidfd_open: %w (is the agent in the host's pid namespace?)", pid, err)
	}
	if err := a.pinPID(c); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// pinPID reads the start time and IDs of c, its pidfd taken, and checks
// that the process is still the one pinned after reading them.
func (a *Attestor) pinPID(c *Caller) error {
	if err := c.pinStart(a.cfg.Binary); err != nil {
		return err
	}
	ids, err := readStatusIDs(c.procRoot, c.PID)
	if err != nil {
		return refusal(ErrProcessGone, "pid %d: %w", c.PID, err)
	}
	c.UID, c.GID = ids.uid, ids.gid
	if err := c.alive(); err != nil {
		return refusal(ErrProcessGone, "pid %d exited while it was pinned (%v)", c.PID, err)
	}
	return nil
}

// Close releases a Caller from PinPID: its pidfd, and the watch Exited
// started (its channel is closed). Attest refuses a closed Caller where
// it holds a pidfd. Safe to call more than once. A socket's Caller is
// released with its connection: Close does nothing to it.
func (c *Caller) Close() error {
	if !c.owned {
		return nil
	}
	return c.release()
}

// release closes c's exit watch, then its pidfd, once.
func (c *Caller) release() error {
	if !c.watch.release() || c.pidfd == nil {
		return nil
	}
	return c.pidfd.Close()
}
