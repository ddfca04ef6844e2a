package connlimit

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An admitted connection carries the TCP user timeout gRPC would have set
// on it unwrapped.
func TestTCPUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l, err := New(ln, Config{Name: "grpc", MaxConns: 1, MaxPerSource: 1, TCPUserTimeout: 20 * time.Second})
	require.NoError(t, err)
	defer l.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	c, err := l.Accept()
	require.NoError(t, err)
	defer c.Close()

	raw, err := c.(*conn).Conn.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var got int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		got, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout)
	}))
	require.NoError(t, gerr)
	assert.Equal(t, 20000, got, "milliseconds")
}
