package attest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// authType is what Caller.AuthType reports.
const authType = "peercred"

// Caller is the process at the other end of a unix socket connection as
// the kernel reported it when it connected (SO_PEERCRED), pinned for the
// pid reuse guard: a pidfd for that very process where the kernel hands
// one out with the credentials (SO_PEERPIDFD, Linux 6.5), else one opened
// at the handshake, and its start time. Attestor.Attest re-checks both
// after reading /proc, so facts read from a pid that meanwhile named
// another process are never used: from connect on with the kernel's
// pidfd, from the handshake on without.
//
// Attestor.PinPID makes one for a process a third party names by pid
// instead; that one is the caller's to Close.
type Caller struct {
	PID int32
	// UID and GID are the effective IDs: from the socket when it
	// connected, or from /proc/<pid>/status when PinPID pinned it.
	UID uint32
	GID uint32
	// StartTime is /proc/<pid>/stat's field 22 at the handshake (or
	// PinPID).
	StartTime uint64
	// SVID is the SPIFFE ID of the X509-SVID the caller presented over
	// mutual TLS (CredentialsWithTLS), verified by the server's TLS
	// config; zero on a plaintext connection.
	SVID spiffeid.ID

	procRoot string
	pidfd    *os.File // nil where the kernel has no pidfds
	// owned: Close releases the pidfd (PinPID's Caller); a socket's
	// Caller is released with its connection instead.
	owned bool
	watch exitWatch
	// exe is the executable the process ran at the handshake, with
	// Config.Binary (zero when it could not be read: attestation then
	// refuses for the same reason).
	exe fileID
	// err says why the process could not be pinned (it exited before
	// the handshake, its pid is not visible here); Attest returns it.
	err error
}

// AuthType implements credentials.AuthInfo.
func (c *Caller) AuthType() string {
	if !c.SVID.IsZero() {
		return authTypeTLS
	}
	return authType
}

// GetCommonAuthInfo reports a unix socket's security: nothing but the
// kernel is between the two ends, as grpc/credentials/local says; TLS
// adds no level above it.
func (c *Caller) GetCommonAuthInfo() credentials.CommonAuthInfo {
	return credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}
}

// CallerFrom returns the caller of the RPC whose context ctx is, on a
// server built with Attestor.Credentials or CredentialsWithTLS.
func CallerFrom(ctx context.Context) (*Caller, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	c, ok := p.AuthInfo.(*Caller)
	return c, ok && c != nil
}

// alive checks that the pinned process is still the one that connected:
// not gone (its pidfd), not exited (its stat), and its pid still has the
// start time it had at the handshake.
func (c *Caller) alive() error {
	if c.pidfd != nil {
		gone, err := pidfdGoneFile(c.pidfd)
		if err != nil {
			return refusal(ErrProcessReplaced, "pid %d: checking its pidfd: %w", c.PID, err)
		}
		if gone {
			return refusal(ErrProcessReplaced, "pid %d exited", c.PID)
		}
	}
	st, err := readStat(c.procRoot, c.PID)
	switch {
	case err != nil:
		return refusal(ErrProcessReplaced, "pid %d: %w", c.PID, err)
	case st.exited():
		return refusal(ErrProcessReplaced, "pid %d exited", c.PID)
	case st.startTime != c.StartTime:
		return refusal(ErrProcessReplaced, "pid %d started at %d, not %d: another process", c.PID, st.startTime, c.StartTime)
	}
	return nil
}

// pidfdGoneFile is pidfdGone on a pidfd held by f, which a connection
// closing meanwhile cannot close (or reuse) underneath.
func pidfdGoneFile(f *os.File) (bool, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return false, err
	}
	var gone bool
	var gerr error
	if err := rc.Control(func(fd uintptr) { gone, gerr = pidfdGone(int(fd)) }); err != nil {
		return false, err
	}
	return gone, gerr
}

// peerCredentials are gRPC server transport credentials for unix
// sockets: no encryption (there is no wire to protect), only the caller
// read from the socket.
type peerCredentials struct {
	procRoot string
	// binary: pin the caller's executable too (Config.Binary).
	binary bool
	// tlsConfig, when set, serves callers that open with a TLS handshake
	// in mutual TLS (CredentialsWithTLS).
	tlsConfig func() (*tls.Config, error)
}

var _ credentials.TransportCredentials = (*peerCredentials)(nil)

func (p *peerCredentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("attest: peer credentials are for servers only")
}

// ServerHandshake reads the caller from the socket, then, with a TLS
// config, handshakes in TLS a caller that opens with one. Only a
// connection that is not a unix socket, or a TLS handshake that fails,
// fails; a caller that cannot be pinned is let through with the reason,
// so its RPCs are refused with it (a connection error tells a workload
// nothing).
func (p *peerCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, nil, fmt.Errorf("attest: %T is not a unix socket", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("attest: %w", err)
	}
	var pid int32
	var uid, gid uint32
	var cerr, perr error
	pidfd := -1
	if err := raw.Control(func(fd uintptr) {
		pid, uid, gid, cerr = peerCred(int(fd))
		if cerr == nil {
			pidfd, perr = peerPidfd(int(fd))
		}
	}); err != nil {
		return nil, nil, fmt.Errorf("attest: %w", err)
	}
	if cerr != nil {
		return nil, nil, fmt.Errorf("attest: reading the caller from the socket (SO_PEERCRED): %w", cerr)
	}
	c := &Caller{PID: pid, UID: uid, GID: gid, procRoot: p.procRoot}
	if perr == nil && pidfd >= 0 {
		c.pidfd = pidfdFile(pidfd, pid) // held from here on, closed with conn
	}
	p.pin(c, perr)
	cc := &callerConn{Conn: conn, caller: c}
	if p.tlsConfig == nil {
		return cc, c, nil
	}
	if err := p.upgrade(cc); err != nil {
		// gRPC closes the raw connection only: release the caller too.
		_ = cc.Close()
		return nil, nil, err
	}
	return cc, c, nil
}

// errNoPidfd: the kernel hands out no pidfds (this way).
var errNoPidfd = errors.New("no pidfd on this kernel")

// pin pins c: its pidfd (from the socket, else opened now) and its start
// time. A failure is kept in c for Attest to report.
func (p *peerCredentials) pin(c *Caller, peerPidfdErr error) {
	if c.PID <= 0 {
		// SO_PEERCRED reports 0 for a process outside this pid namespace.
		c.err = refusal(ErrProcessGone, "the kernel reports no pid for the caller (uid %d): is it in another pid namespace?", c.UID)
		return
	}
	if peerPidfdErr != nil {
		pidfd, err := openPidfd(c.PID, peerPidfdErr)
		if err != nil {
			c.err = err
			return
		}
		if pidfd >= 0 {
			c.pidfd = pidfdFile(pidfd, c.PID)
		}
	}
	c.err = c.pinStart(p.binary)
}

// pinStart reads c's start time, and with binary its executable (left
// zero where it cannot be read: attestation then refuses for the same
// reason). Read after the pidfd is taken, so that a pid reused in between
// is caught by the pidfd.
func (c *Caller) pinStart(binary bool) error {
	st, err := readStat(c.procRoot, c.PID)
	switch {
	case err != nil:
		return refusal(ErrProcessGone, "pid %d: %w", c.PID, err)
	case st.exited():
		return refusal(ErrProcessGone, "pid %d exited", c.PID)
	}
	c.StartTime = st.startTime
	if binary {
		if fi, err := os.Stat(filepath.Join(c.procRoot, strconv.Itoa(int(c.PID)), "exe")); err == nil {
			c.exe, _ = idOf(fi)
		}
	}
	return nil
}

// pidfdFile holds pidfd in an os.File, closed on exec and non-blocking:
// os.NewFile then registers it with the runtime's poller, on which
// Caller.Exited waits for the process to exit without holding a thread.
func pidfdFile(pidfd int, pid int32) *os.File {
	preparePidfd(pidfd)
	return os.NewFile(uintptr(pidfd), fmt.Sprintf("pidfd:%d", pid))
}

// openPidfd falls back to pidfd_open where the socket hands out no pidfd
// (kernels before 6.5), and to none at all before 5.3; the start time
// check then stands alone. Any other error means the caller is gone.
func openPidfd(pid int32, peerPidfdErr error) (int, error) {
	if !errors.Is(peerPidfdErr, errNoPidfd) {
		return -1, refusal(ErrProcessGone, "pid %d: SO_PEERPIDFD: %w", pid, peerPidfdErr)
	}
	fd, err := pidfdOpen(pid)
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, errNoPidfd):
		return -1, nil
	default:
		return -1, refusal(ErrProcessGone, "pid %d: pidfd_open: %w", pid, err)
	}
}

func (p *peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: authType}
}

func (p *peerCredentials) Clone() credentials.TransportCredentials {
	c := *p
	return &c
}

func (p *peerCredentials) OverrideServerName(string) error { return nil }

// callerConn releases the caller (its pidfd, its exit watch) with the
// connection.
type callerConn struct {
	net.Conn
	caller *Caller
}

func (c *callerConn) Close() error {
	err := c.Conn.Close()
	_ = c.caller.release()
	return err
}
