//go:build !linux

package connlimit

import (
	"net"
	"time"
)

// setTCPUserTimeout does nothing where TCP_USER_TIMEOUT is not Linux's,
// as gRPC's own does nothing there.
func setTCPUserTimeout(net.Conn, time.Duration) error { return nil }
