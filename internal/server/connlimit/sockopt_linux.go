package connlimit

import (
	"fmt"
	"net"
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT (linux/tcp.h), which package syscall
// does not name.
const tcpUserTimeout = 0x12

// setTCPUserTimeout sets TCP_USER_TIMEOUT on c, if it is a *net.TCPConn,
// as gRPC's server does on the connections it sees unwrapped.
func setTCPUserTimeout(c net.Conn, d time.Duration) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d/time.Millisecond))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt TCP_USER_TIMEOUT: %w", serr)
	}
	return nil
}
