//go:build linux

package attest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// childEnv makes the test binary a client (runChild) instead of running
// tests; childSocket names the socket it calls.
const (
	childEnv    = "TRUSTBRIDGE_ATTEST_CHILD"
	childSocket = "TRUSTBRIDGE_ATTEST_SOCKET"
)

// childMain runs the child process when the test binary was started as
// one, and returns its exit code.
func childMain() (int, bool) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		return 0, false
	}
	return runChild(mode), true
}

// runChild is the child process: with childEnv=call it calls once; with
// childEnv=wait it first waits for a line on stdin (the parent moves it
// to a cgroup meanwhile). It exits 0 when the call succeeded.
func runChild(mode string) int {
	if mode == "wait" {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "child: reading stdin:", err)
			return 2
		}
	}
	if err := call(os.Getenv(childSocket)); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// call makes one Health.Check call on the unix socket at path.
func call(path string) error {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// result is one attestation the probe server made.
type result struct {
	caller *Caller
	facts  Facts
	err    error
}

// probe is a Health server whose Check attests its caller and reports
// the result; before, if set, runs between the handshake and Attest.
type probe struct {
	healthpb.UnimplementedHealthServer
	a      *Attestor
	before func(*Caller)
	got    chan result
}

func (p *probe) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	c, _ := CallerFrom(ctx)
	if p.before != nil {
		p.before(c)
	}
	f, err := p.a.Attest(ctx, c)
	p.got <- result{caller: c, facts: f, err: err}
	if err != nil {
		return nil, Status(err)
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serve serves p on a new unix socket with creds (nil: the Attestor's),
// reachable by any user, and returns its path.
func serve(t *testing.T, p *probe, creds ...grpc.ServerOption) string {
	t.Helper()
	if p.got == nil {
		p.got = make(chan result, 8)
	}
	dir := worldDir(t)
	path := filepath.Join(dir, "agent.sock")
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(path, 0o777))
	opts := creds
	if len(opts) == 0 {
		opts = []grpc.ServerOption{grpc.Creds(p.a.Credentials())}
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, p)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
	return path
}

// worldDir is a temporary directory every user can enter, for a child
// running as another user.
func worldDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	return dir
}

// child prepares the test binary as a client of socket in mode; cred,
// if set, runs it as another user (root only). The binary is copied where
// that user can run it.
func child(t *testing.T, socket, mode string, cred *syscall.Credential) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	bin := self
	if cred != nil {
		bin = filepath.Join(worldDir(t), "attest.test")
		copyFile(t, self, bin)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childSocket+"="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o755))
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (runs a child as another user, or makes cgroups)")
	}
}

// started runs cmd and returns a channel closed once it exited (and was
// reaped); the process is killed, if still running, when the test ends.
func started(t *testing.T, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return done
}

// await returns the probe's next result, failing the test if the child
// exits first (it failed before calling, or the call failed unattested).
func await(t *testing.T, p *probe, exited <-chan struct{}, out fmt.Stringer) result {
	t.Helper()
	select {
	case r := <-p.got:
		return r
	case <-exited:
		select {
		case r := <-p.got:
			return r
		default:
		}
		t.Fatalf("child exited without a call attested: %s", out)
		return result{}
	}
}
