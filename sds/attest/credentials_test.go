//go:build linux

package attest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// A client in this process: the server sees this process.
func TestCallerInProcess(t *testing.T) {
	p := &probe{a: newAttestor(t, Config{})}
	require.NoError(t, call(serve(t, p)))
	r := <-p.got
	require.NoError(t, r.err)
	assert.Equal(t, int32(os.Getpid()), r.caller.PID)
	assert.Equal(t, uint32(os.Geteuid()), r.caller.UID)
	assert.Equal(t, uint32(os.Getegid()), r.caller.GID)
	st, err := readStat("/proc", int32(os.Getpid()))
	require.NoError(t, err)
	assert.Equal(t, st.startTime, r.caller.StartTime)
	assert.NotNil(t, r.caller.pidfd, "pidfd from SO_PEERPIDFD or pidfd_open")

	assert.Equal(t, r.caller.PID, r.facts.PID)
	assert.Equal(t, r.caller.UID, r.facts.Unix.UID)
	u, err := user.LookupId(strconv.Itoa(os.Geteuid()))
	require.NoError(t, err)
	assert.Equal(t, u.Username, r.facts.Unix.User)
	assert.Empty(t, r.facts.Unix.BinaryPath, "opt-in")
	// This test process is in no pod, unless the machine is.
	b, err := os.ReadFile("/proc/self/cgroup")
	require.NoError(t, err)
	if place, err := parseCgroup(b); err == nil && !place.inPod() {
		assert.Nil(t, r.facts.Kubernetes)
	}
}

// A child process running as another user and group: the server sees
// the child's pid, uid and gid, not its own.
func TestCallerChildOtherUser(t *testing.T) {
	requireRoot(t)
	p := &probe{a: newAttestor(t, Config{})}
	sock := serve(t, p)
	cmd := child(t, sock, "call", &syscall.Credential{Uid: 4242, Gid: 4343})
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", out)
	r := <-p.got
	require.NoError(t, r.err)
	assert.Equal(t, int32(cmd.Process.Pid), r.caller.PID)
	assert.Equal(t, uint32(4242), r.caller.UID)
	assert.Equal(t, uint32(4343), r.caller.GID)
	assert.Equal(t, uint32(4242), r.facts.Unix.UID)
	assert.Equal(t, uint32(4343), r.facts.Unix.GID)
}

// A child that is killed and reaped between the handshake and Attest is
// refused: its pid no longer names it.
func TestCallerExitsBeforeAttestation(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := &probe{a: newAttestor(t, Config{Registerer: reg})}
	started := make(chan *os.Process, 1)
	p.before = func(*Caller) {
		// The child waits for its answer: kill and reap it now.
		proc := <-started
		assert.NoError(t, proc.Kill())
		_, _ = proc.Wait()
	}
	sock := serve(t, p)
	c := child(t, sock, "call", nil)
	require.NoError(t, c.Start())
	started <- c.Process
	r := <-p.got
	require.ErrorIs(t, r.err, ErrProcessReplaced)
	assert.Equal(t, codes.PermissionDenied, status.Code(Status(r.err)))
	assert.Contains(t, status.Convert(Status(r.err)).Message(), "exited or was replaced")
	assert.Equal(t, 1.0, testutil.ToFloat64(p.a.failures.WithLabelValues("process_replaced")))
	assert.Equal(t, 0.0, testutil.ToFloat64(p.a.failures.WithLabelValues("process_gone")))
}

// fakeProc is a /proc holding only pid's stat and cgroup files.
func fakeProc(t *testing.T, pid int, stat, cgroup string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, strconv.Itoa(pid))
	require.NoError(t, os.Mkdir(dir, 0o755))
	writeFile(t, filepath.Join(dir, "stat"), stat)
	writeFile(t, filepath.Join(dir, "cgroup"), cgroup)
	return root
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

// The start time check on its own, with a /proc the test controls: the
// caller (this process, so its pidfd stays live) seems to be replaced
// between handshake and attestation by a process with the same pid.
func TestPidReuseStartTime(t *testing.T) {
	pid := os.Getpid()
	pidS := strconv.Itoa(pid)
	tests := []struct {
		name    string
		after   string // stat at attestation; "" leaves it
		wantErr error
	}{
		{"same process", "", nil},
		{"pid reused", statLine(pidS, "impostor", "S", "200"), ErrProcessReplaced},
		{"exited, not reaped", statLine(pidS, "attest.test", "Z", "100"), ErrProcessReplaced},
		{"gone", "-", ErrProcessReplaced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := fakeProc(t, pid, statLine(pidS, "attest.test", "S", "100"), "0::/\n")
			p := &probe{a: newAttestor(t, Config{ProcRoot: root})}
			p.before = func(c *Caller) {
				assert.Equal(t, uint64(100), c.StartTime)
				switch tt.after {
				case "":
				case "-":
					require.NoError(t, os.RemoveAll(filepath.Join(root, pidS)))
				default:
					writeFile(t, filepath.Join(root, pidS, "stat"), tt.after)
				}
			}
			err := call(serve(t, p))
			r := <-p.got
			if tt.wantErr == nil {
				require.NoError(t, r.err)
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, r.err, tt.wantErr)
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "the client sees the refusal")
			assert.Contains(t, status.Convert(err).Message(), "exited or was replaced")
		})
	}
}

// A caller whose pid has no stat at the handshake is refused with why.
func TestCallerNotPinned(t *testing.T) {
	p := &probe{a: newAttestor(t, Config{ProcRoot: t.TempDir()})}
	err := call(serve(t, p))
	r := <-p.got
	require.ErrorIs(t, r.err, ErrProcessGone)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
}

// A server without the Attestor's credentials has no caller to attest:
// refused, never a default identity.
func TestNoCaller(t *testing.T) {
	p := &probe{a: newAttestor(t, Config{})}
	err := call(serve(t, p, grpc.Creds(insecure.NewCredentials())))
	r := <-p.got
	require.ErrorIs(t, r.err, ErrNoCaller)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))

	_, err = p.a.AttestPeer(context.Background())
	require.ErrorIs(t, err, ErrNoCaller)
}

// The opt-in binary facts name and hash this test binary.
func TestBinaryFacts(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	sum := sha256.Sum256(b)

	p := &probe{a: newAttestor(t, Config{Binary: true})}
	require.NoError(t, call(serve(t, p)))
	r := <-p.got
	require.NoError(t, r.err)
	assert.Equal(t, self, r.facts.Unix.BinaryPath)
	assert.Equal(t, hex.EncodeToString(sum[:]), r.facts.Unix.BinarySHA256)

	// Over the size bound: refused, not hashed in part.
	p = &probe{a: newAttestor(t, Config{Binary: true, MaxBinarySize: int64(len(b) - 1)})}
	err = call(serve(t, p))
	r = <-p.got
	require.ErrorIs(t, r.err, ErrBinary)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
}

// Kubernetes facts come from the pod lookup with the pod UID and
// container ID of the caller's cgroups; its refusals reach the client.
func TestPodLookup(t *testing.T) {
	pid := os.Getpid()
	pidS := strconv.Itoa(pid)
	root := fakeProc(t, pid, statLine(pidS, "attest.test", "S", "100"),
		"0::/kubepods.slice/kubepods-pod"+testUID_+".slice/cri-containerd-"+testCID+".scope\n")
	want := KubernetesFacts{PodUID: testUID, ContainerID: testCID, Namespace: "ns", ServiceAccount: "sa"}
	var lookupErr atomic.Pointer[error]
	lookup := PodLookupFunc(func(_ context.Context, podUID, containerID string) (KubernetesFacts, error) {
		if podUID != testUID || containerID != testCID {
			return KubernetesFacts{}, refusal(ErrUnknownPod, "%s", podUID)
		}
		if err := lookupErr.Load(); err != nil {
			return KubernetesFacts{}, *err
		}
		return want, nil
	})
	p := &probe{a: newAttestor(t, Config{ProcRoot: root, Pods: lookup})}
	sock := serve(t, p)
	require.NoError(t, call(sock))
	r := <-p.got
	require.NoError(t, r.err)
	require.NotNil(t, r.facts.Kubernetes)
	assert.Equal(t, want, *r.facts.Kubernetes)

	unavailable := refusal(ErrKubeUnavailable, "not synced")
	lookupErr.Store(&unavailable)
	err := call(sock)
	<-p.got
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "not synced")

	// Without a lookup: the pod UID and container ID only.
	bare := &probe{a: newAttestor(t, Config{ProcRoot: root})}
	require.NoError(t, call(serve(t, bare)))
	r = <-bare.got
	require.NoError(t, r.err)
	assert.Equal(t, &KubernetesFacts{PodUID: testUID, ContainerID: testCID}, r.facts.Kubernetes)

	// Cgroups that do not say: refused.
	writeFile(t, filepath.Join(root, pidS, "cgroup"), "0::/kubepods.slice/kubepods-pod"+testUID_+".slice\n")
	err = call(sock)
	r = <-p.got
	require.ErrorIs(t, r.err, ErrCgroup)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
}

// The pidfd primitives, on the pidfd_open fallback path that kernels
// without SO_PEERPIDFD take: live, then gone once killed and reaped,
// while the pid itself may already name another process.
func TestPidfdFallback(t *testing.T) {
	cmd := child(t, "unused", "wait", nil)
	_, err := cmd.StdinPipe() // held open: the child waits
	require.NoError(t, err)
	exited := started(t, cmd)
	pid := int32(cmd.Process.Pid)

	fd, err := openPidfd(pid, errNoPidfd)
	require.NoError(t, err)
	require.GreaterOrEqual(t, fd, 0)
	f := pidfdFile(fd, pid)
	defer f.Close()
	gone, err := pidfdGoneFile(f)
	require.NoError(t, err)
	assert.False(t, gone)

	require.NoError(t, cmd.Process.Kill())
	<-exited
	gone, err = pidfdGoneFile(f)
	require.NoError(t, err)
	assert.True(t, gone)

	_, err = openPidfd(pid, syscall.EINVAL)
	require.ErrorIs(t, err, ErrProcessGone, "SO_PEERPIDFD failing otherwise: the caller is gone")
	require.NoError(t, f.Close())
	_, err = pidfdGoneFile(f)
	require.Error(t, err, "a closed pidfd is never a live one")
}
