package attest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Real cgroups, v1 (the pids hierarchy) and v2 (the unified one): a child
// moved into a pod's container cgroup by the kernel is attested as that
// pod and container, from its real /proc/<pid>/cgroup.
func TestRealCgroups(t *testing.T) {
	for _, h := range []struct {
		name  string
		mount string
		magic int64
	}{
		{"v1 pids", "/sys/fs/cgroup/pids", unix.CGROUP_SUPER_MAGIC},
		{"v2", v2Mount(), unix.CGROUP2_SUPER_MAGIC},
	} {
		t.Run(h.name, func(t *testing.T) {
			requireHierarchy(t, h.mount, h.magic)
			podUID, cid := randomUID(t), randomHex(t, 32)
			p := &probe{a: newAttestor(t, Config{})}
			r, pid := attestInCgroup(t, p, containerCgroup(t, h.mount, podUID, cid))
			require.NoError(t, r.err)
			assert.Equal(t, pid, r.caller.PID)
			require.NotNil(t, r.facts.Kubernetes)
			assert.Equal(t, podUID, r.facts.Kubernetes.PodUID)
			assert.Equal(t, cid, r.facts.Kubernetes.ContainerID)
		})
	}
}

// v2Mount is where the cgroup v2 hierarchy is: beside the v1 ones on a
// hybrid host like these, else at /sys/fs/cgroup itself.
func v2Mount() string {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup/unified", &fs); err == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
		return "/sys/fs/cgroup/unified"
	}
	return "/sys/fs/cgroup"
}

// requireHierarchy skips the test unless it runs as root and a cgroup
// hierarchy of type magic is mounted at mount.
func requireHierarchy(t *testing.T, mount string, magic int64) {
	t.Helper()
	requireRoot(t)
	var fs unix.Statfs_t
	if err := unix.Statfs(mount, &fs); err != nil || int64(fs.Type) != magic {
		t.Skipf("no cgroup hierarchy mounted at %s (statfs: %v, type %#x)", mount, err, fs.Type)
	}
}

// containerCgroup makes the systemd driver's cgroup of container cid in
// pod podUID (guaranteed QoS, containerd) under mount.
func containerCgroup(t *testing.T, mount, podUID, cid string) string {
	t.Helper()
	return makeCgroup(t, mount, "kubepods.slice",
		"kubepods-pod"+strings.ReplaceAll(podUID, "-", "_")+".slice",
		"cri-containerd-"+cid+".scope")
}

// attestInCgroup starts a child, has the kernel move it into the cgroup
// dir, then lets it call p, and returns what p made of it and the child's
// pid. The child has exited when it returns.
func attestInCgroup(t *testing.T, p *probe, dir string) (result, int32) {
	t.Helper()
	cmd := child(t, serve(t, p), "wait", nil)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its cleanup (kill and reap) runs before makeCgroup's.
	exited := started(t, cmd)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644))
	_, err = fmt.Fprintln(stdin, "go")
	require.NoError(t, err)
	r := await(t, p, exited, &out)
	<-exited
	if r.err == nil {
		require.True(t, cmd.ProcessState.Success(), "child: %s", out.String())
	}
	return r, int32(cmd.Process.Pid)
}

// makeCgroup makes the cgroup path under a hierarchy's mount and removes
// what it made, deepest first, when the test ends (after its processes
// exited). It skips the test when the kernel refuses to make it. The first
// element may be shared with other tests on the machine: removing it is
// left to the last one out.
func makeCgroup(t *testing.T, mount string, path ...string) string {
	t.Helper()
	dir := mount
	for i, p := range path {
		dir = filepath.Join(dir, p)
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, os.ErrExist) && i < len(path)-1 {
			continue
		}
		if err != nil {
			t.Skipf("cannot make cgroup %s: %v", dir, err)
		}
		made, shared := dir, i == 0
		t.Cleanup(func() {
			err := os.Remove(made)
			if shared && (errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, os.ErrNotExist)) {
				return
			}
			if err != nil {
				t.Errorf("removing cgroup %s: %v", made, err)
			}
		})
	}
	return dir
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

func randomUID(t *testing.T) string {
	h := randomHex(t, 16)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
