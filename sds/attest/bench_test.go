//go:build linux

package attest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
)

// BenchmarkAttestConnection measures what attesting a new connection to
// the node agent's socket costs (issue 34), against the least any server
// that tells its callers apart by SO_PEERCRED does, in the same run:
//
//   - baseline:peercred: dial the unix socket, accept, read SO_PEERCRED
//     (unix.GetsockoptUcred), close;
//   - host: the same connection through Credentials' handshake (SO_PEERCRED,
//     the kernel's pidfd from SO_PEERPIDFD or pidfd_open, the start time
//     from /proc/<pid>/stat) and Attest (user and group names, the real
//     /proc/self/cgroup, which puts this process in no pod, and the
//     liveness re-check: pidfd and stat again);
//   - pod: the same with a /proc whose cgroup file puts the caller in a
//     pod's container (stat and exe are links to the real ones), so
//     Attest also parses the pod path and asks a PodLookup; the lookup is
//     a fake returning fixed facts, as Pods' is a read of the informer's
//     index;
//   - pod+binary: pod with Config.Binary (opt-in): readlink and SHA-256 of
//     the caller's whole executable, this test binary, on every
//     attestation.
//
// Each iteration of an attested sub-benchmark also makes one baseline
// connection, alternating which goes first, so that load from elsewhere
// on the machine falls on both alike: ns/op is the attested connection's
// time alone, x-peercred its total over the baseline connections' total
// in that same loop (benchreport's ratio column compares with the
// separate baseline:peercred row instead). B/op and allocs/op of those
// rows count the baseline connection too.
func BenchmarkAttestConnection(b *testing.B) {
	pid := os.Getpid()
	pod := benchProc(b, pid)
	lookup := PodLookupFunc(func(_ context.Context, podUID, containerID string) (KubernetesFacts, error) {
		return KubernetesFacts{PodUID: podUID, ContainerID: containerID, Namespace: "ns", PodName: "p", ServiceAccount: "sa",
			Labels: map[string]string{"app": "web"}, ContainerName: "c", Image: "img", ImageID: "sha256:0"}, nil
	})
	lis := benchListener(b)

	b.Run("baseline:peercred", func(b *testing.B) {
		for b.Loop() {
			peercredConn(b, lis)
		}
	})
	for _, tt := range []struct {
		name   string
		cfg    Config
		podded bool
	}{
		{"host", Config{}, false},
		{"pod", Config{ProcRoot: pod, Pods: lookup}, true},
		{"pod+binary", Config{ProcRoot: pod, Pods: lookup, Binary: true}, true},
	} {
		b.Run(tt.name, func(b *testing.B) {
			a, err := New(tt.cfg)
			require.NoError(b, err)
			creds := a.Credentials()
			// One untimed attestation checks the set-up says what it
			// should: a pod only where the cgroup file puts one.
			f := attestedConn(b, lis, a, creds)
			require.Equal(b, tt.podded, f.Kubernetes != nil, "in a pod")
			require.Equal(b, tt.cfg.Binary, f.Unix.BinarySHA256 != "", "binary hashed")
			var ours, base time.Duration
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					base += timed(func() { peercredConn(b, lis) })
					ours += timed(func() { attestedConn(b, lis, a, creds) })
				} else {
					ours += timed(func() { attestedConn(b, lis, a, creds) })
					base += timed(func() { peercredConn(b, lis) })
				}
				i++
			}
			b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "ns/op")
			b.ReportMetric(float64(ours)/float64(base), "x-peercred")
		})
	}
}

func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

// benchListener is a unix socket listener in a temporary directory.
func benchListener(b *testing.B) *net.UnixListener {
	b.Helper()
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(b.TempDir(), "agent.sock"), Net: "unix"})
	require.NoError(b, err)
	b.Cleanup(func() { _ = lis.Close() })
	return lis
}

// accept dials lis from this process and accepts that connection: a
// unix socket's connect completes against the backlog, so one goroutine
// does both.
func accept(b *testing.B, lis *net.UnixListener) (client, server net.Conn) {
	client, err := net.Dial("unix", lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	server, err = lis.AcceptUnix()
	if err != nil {
		b.Fatal(err)
	}
	return client, server
}

// peercredConn is the baseline: a connection and its SO_PEERCRED.
func peercredConn(b *testing.B, lis *net.UnixListener) {
	client, server := accept(b, lis)
	raw, err := server.(syscall.Conn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	var cerr error
	var uc *unix.Ucred
	if err := raw.Control(func(fd uintptr) { uc, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		b.Fatal(err)
	}
	if cerr != nil || uc.Pid != int32(os.Getpid()) {
		b.Fatalf("SO_PEERCRED: %v %+v", cerr, uc)
	}
	_ = server.Close()
	_ = client.Close()
}

// attestedConn is a connection through creds' handshake and a's Attest.
func attestedConn(b *testing.B, lis *net.UnixListener, a *Attestor, creds credentials.TransportCredentials) Facts {
	client, server := accept(b, lis)
	conn, info, err := creds.ServerHandshake(server)
	if err != nil {
		b.Fatal(err)
	}
	f, err := a.Attest(context.Background(), info.(*Caller))
	if err != nil {
		b.Fatal(err)
	}
	_ = conn.Close()
	_ = client.Close()
	return f
}

// benchProc is a /proc for pid whose cgroup file puts it in a pod's
// container and whose stat and exe are links to the real ones, so the
// pid reuse guard and the binary digest read this very process.
func benchProc(b *testing.B, pid int) string {
	b.Helper()
	root := b.TempDir()
	dir := filepath.Join(root, strconv.Itoa(pid))
	require.NoError(b, os.Mkdir(dir, 0o755))
	for _, name := range []string{"stat", "exe"} {
		require.NoError(b, os.Symlink(fmt.Sprintf("/proc/%d/%s", pid, name), filepath.Join(dir, name)))
	}
	cgroup := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope\n"
	require.NoError(b, os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644))
	return root
}
