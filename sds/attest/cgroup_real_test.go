//go:build linux

package attest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/trustbridge/trustbridge/internal/testkit/cgrouptest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// Real cgroups, v1 (the pids hierarchy) and v2 (the unified one): a child
// moved into a pod's container cgroup by the kernel is attested as that
// pod and container, from its real /proc/<pid>/cgroup.
func TestRealCgroups(t *testing.T) {
	for _, h := range cgrouptest.Hierarchies() {
		t.Run(h.Name, func(t *testing.T) {
			h.Require(t)
			podUID, cid := randomUID(t), randomHex(t, 32)
			p := &probe{a: newAttestor(t, Config{})}
			r, pid := attestInCgroup(t, p, h.Container(t, podUID, cid))
			require.NoError(t, r.err)
			assert.Equal(t, pid, r.caller.PID)
			require.NotNil(t, r.facts.Kubernetes)
			assert.Equal(t, podUID, r.facts.Kubernetes.PodUID)
			assert.Equal(t, cid, r.facts.Kubernetes.ContainerID)
		})
	}
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
	// Its cleanup (kill and reap) runs before the cgroup's (cgrouptest.Make).
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

// The whole chain, with real parts: a child the kernel moved into the
// cgroup of a real pod's container is attested as that pod, from the API
// server; a child in the same pod's sandbox (a container not in its
// status) is refused, and told why.
func TestAttestRealPod(t *testing.T) {
	v2 := cgrouptest.V2()
	v2.Require(t)
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

	r, pid := attestInCgroup(t, p, v2.Container(t, string(web.UID), appID))
	require.NoError(t, r.err)
	assert.Equal(t, pid, r.facts.PID)
	assert.Equal(t, &KubernetesFacts{PodUID: string(web.UID), ContainerID: appID, Namespace: ns, PodName: "web", ServiceAccount: "workload",
		Labels: map[string]string{"app": "web"}, ContainerName: "app", Image: "example.com/web:1", ImageID: "example.com/app@sha256:" + appID}, r.facts.Kubernetes)

	r, _ = attestInCgroup(t, p, v2.Container(t, string(web.UID), sandboxID))
	require.ErrorIs(t, r.err, ErrUnknownContainer)
	assert.Equal(t, codes.PermissionDenied, status.Code(Status(r.err)))
}

// The broker's path, with real cgroups: a child the kernel moved into a
// pod's container cgroup, named by pid by another party (this test, not
// a socket), is pinned and attested as that pod and container; the pod
// named by reference gives the same pod facts. Once it exited, Exited is
// closed and Attest refuses it.
func TestPinPIDRealCgroups(t *testing.T) {
	for _, h := range cgrouptest.Hierarchies() {
		t.Run(h.Name, func(t *testing.T) {
			h.Require(t)
			podUID, cid := randomUID(t), randomHex(t, 32)
			dir := h.Container(t, podUID, cid)
			pod := fakePod("shop", "web", podUID, fakeNode, corev1.PodRunning)
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + cid, ImageID: "example.com/app@sha256:1"}}
			pods, _, _ := fakePods(t, 1, pod)
			a := newAttestor(t, Config{Pods: pods})

			cmd, reaped := waiting(t, nil)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644))
			c, err := a.PinPID(int32(cmd.Process.Pid))
			require.NoError(t, err)
			defer c.Close()
			exited := c.Exited()

			f, err := a.Attest(context.Background(), c)
			require.NoError(t, err)
			assert.Equal(t, c.PID, f.PID)
			require.NotNil(t, f.Kubernetes)
			assert.Equal(t, KubernetesFacts{PodUID: podUID, ContainerID: cid, Namespace: "shop", PodName: "web", ServiceAccount: "web-sa",
				Labels: map[string]string{"app": "web"}, ContainerName: "app", Image: "example.com/app:1", ImageID: "example.com/app@sha256:1"}, *f.Kubernetes)
			k, err := pods.LookupPod(context.Background(), PodRef{Namespace: "shop", Name: "web", UID: podUID})
			require.NoError(t, err)
			want := *f.Kubernetes
			want.ContainerID, want.ContainerName, want.Image, want.ImageID = "", "", "", ""
			assert.Equal(t, want, k)
			assert.False(t, isClosed(exited), "the child runs")

			require.NoError(t, cmd.Process.Kill())
			<-reaped
			<-exited
			_, err = a.Attest(context.Background(), c)
			require.ErrorIs(t, err, ErrProcessReplaced)
			assert.Equal(t, codes.PermissionDenied, status.Code(Status(err)))
		})
	}
}
