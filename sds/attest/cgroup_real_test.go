//go:build linux

package attest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// statfs(2) magic numbers of the cgroup file systems.
const (
	cgroup1Magic = 0x27e0eb
	cgroup2Magic = 0x63677270
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
		{"v1 pids", "/sys/fs/cgroup/pids", cgroup1Magic},
		{"v2", v2Mount(), cgroup2Magic},
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
	var fs syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/cgroup/unified", &fs); err == nil && fs.Type == cgroup2Magic {
		return "/sys/fs/cgroup/unified"
	}
	return "/sys/fs/cgroup"
}

// requireHierarchy skips the test unless it runs as root and a cgroup
// hierarchy of type magic is mounted at mount.
func requireHierarchy(t *testing.T, mount string, magic int64) {
	t.Helper()
	requireRoot(t)
	var fs syscall.Statfs_t
	if err := syscall.Statfs(mount, &fs); err != nil || int64(fs.Type) != magic {
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
			if shared && (errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, os.ErrNotExist)) {
				return
			}
			if err != nil {
				t.Errorf("removing cgroup %s: %v", made, err)
			}
		})
	}
	return dir
}

// The whole chain, with real parts: a child the kernel moved into the
// cgroup of a real pod's container is attested as that pod, from the API
// server; a child in the same pod's sandbox (a container not in its
// status) is refused, and told why.
func TestAttestRealPod(t *testing.T) {
	mount := v2Mount()
	requireHierarchy(t, mount, cgroup2Magic)
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	serviceAccount(t, env.Client, ns)
	node := "node-" + randomHex(t, 4)
	appID, sandboxID := randomHex(t, 32), randomHex(t, 32)
	web := kubePod(t, env.Client, ns, "web", node, appID)

	pods := newPods(t, PodsConfig{Client: env.Client, NodeName: node, Wait: 1})
	runPods(t, pods)
	waitSynced(t, pods)
	p := &probe{a: newAttestor(t, Config{Pods: pods})}

	r, pid := attestInCgroup(t, p, containerCgroup(t, mount, string(web.UID), appID))
	require.NoError(t, r.err)
	assert.Equal(t, pid, r.facts.PID)
	assert.Equal(t, &KubernetesFacts{PodUID: string(web.UID), ContainerID: appID, Namespace: ns, PodName: "web", ServiceAccount: "workload",
		Labels: map[string]string{"app": "web"}, ContainerName: "app", Image: "example.com/web:1", ImageID: "example.com/app@sha256:" + appID}, r.facts.Kubernetes)

	r, _ = attestInCgroup(t, p, containerCgroup(t, mount, string(web.UID), sandboxID))
	require.ErrorIs(t, r.err, ErrUnknownContainer)
	assert.Equal(t, codes.PermissionDenied, status.Code(Status(r.err)))
}
