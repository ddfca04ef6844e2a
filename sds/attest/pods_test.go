package attest

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

func TestContainerFacts(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: types.UID(testUID), Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "web-sa",
			Containers:         []corev1.Container{{Name: "app", Image: "example.com/app:1"}},
			InitContainers:     []corev1.Container{{Name: "init", Image: "example.com/init:1"}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
				Name: "debug", Image: "example.com/debug:1"}}},
		},
		Status: corev1.PodStatus{
			ContainerStatuses:          []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + testCID, ImageID: "example.com/app@sha256:1"}},
			InitContainerStatuses:      []corev1.ContainerStatus{{Name: "init", ContainerID: "cri-o://" + otherCID}},
			EphemeralContainerStatuses: []corev1.ContainerStatus{{Name: "debug", ContainerID: "docker://" + randomHex(t, 32)}},
		},
	}
	want := KubernetesFacts{PodUID: testUID, ContainerID: testCID, Namespace: "shop", PodName: "web", ServiceAccount: "web-sa",
		Labels: map[string]string{"app": "web"}, ContainerName: "app", Image: "example.com/app:1", ImageID: "example.com/app@sha256:1"}
	k, err := containerFacts(pod, testCID)
	require.NoError(t, err)
	assert.Equal(t, want, k)
	k.Labels["app"] = "changed"
	assert.Equal(t, "web", pod.Labels["app"], "the cached pod is not shared")

	k, err = containerFacts(pod, otherCID)
	require.NoError(t, err)
	assert.Equal(t, "init", k.ContainerName)
	assert.Equal(t, "example.com/init:1", k.Image)

	_, debugID, _ := cutID(pod.Status.EphemeralContainerStatuses[0].ContainerID)
	k, err = containerFacts(pod, debugID)
	require.NoError(t, err)
	assert.Equal(t, "debug", k.ContainerName)
	assert.Equal(t, "example.com/debug:1", k.Image)

	_, err = containerFacts(pod, randomHex(t, 32))
	require.ErrorIs(t, err, ErrUnknownContainer)
	// An ID without a runtime prefix is not matched.
	pod.Status.ContainerStatuses[0].ContainerID = testCID
	_, err = containerFacts(pod, testCID)
	require.ErrorIs(t, err, ErrUnknownContainer)
}

func cutID(s string) (string, string, bool) {
	for i := 0; i+3 <= len(s); i++ {
		if s[i:i+3] == "://" {
			return s[:i], s[i+3:], true
		}
	}
	return "", "", false
}

// runPods runs p until the test ends.
func runPods(t *testing.T, p *Pods) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, p.Run(ctx))
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

func newPods(t *testing.T, cfg PodsConfig) *Pods {
	t.Helper()
	p, err := NewPods(cfg)
	require.NoError(t, err)
	return p
}

// kubePod creates pod ns/name on node with a container "app" and an init
// container "init", then sets their container IDs in its status (none
// when ids is empty); it returns the pod as created.
func kubePod(t *testing.T, c kubernetes.Interface, ns, name, node string, ids ...string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: "workload",
			Containers:         []corev1.Container{{Name: "app", Image: "example.com/" + name + ":1"}},
			InitContainers:     []corev1.Container{{Name: "init", Image: "example.com/init:1"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	if len(ids) > 0 {
		pod = setStatus(t, c, pod, ids...)
	}
	return pod
}

// setStatus sets the container IDs of "app" and, if given, "init".
func setStatus(t *testing.T, c kubernetes.Interface, pod *corev1.Pod, ids ...string) *corev1.Pod {
	t.Helper()
	pod = pod.DeepCopy()
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + ids[0], Image: pod.Spec.Containers[0].Image, ImageID: "example.com/app@sha256:" + ids[0]}}
	if len(ids) > 1 {
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", ContainerID: "containerd://" + ids[1], Image: "example.com/init:1"}}
	}
	pod, err := c.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	return pod
}

func serviceAccount(t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	_, err := c.CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "workload"}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

func waitSynced(t *testing.T, p *Pods) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.True(t, cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced), "pods informer did not sync")
}

// Against a real API server: only this node's pods, found by pod UID and
// container ID; everything else refused.
func TestPodsLookup(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	serviceAccount(t, env.Client, ns)
	node, otherNode := "node-"+randomHex(t, 4), "node-"+randomHex(t, 4)
	appID, initID, otherID := randomHex(t, 32), randomHex(t, 32), randomHex(t, 32)
	other := kubePod(t, env.Client, ns, "other", otherNode, otherID)
	web := kubePod(t, env.Client, ns, "web", node, appID, initID)

	// Refusals do not wait: everything is there once listed.
	p := newPods(t, PodsConfig{Client: env.Client, NodeName: node, Wait: 1})
	runPods(t, p)
	waitSynced(t, p)
	ctx := context.Background()

	k, err := p.Lookup(ctx, string(web.UID), appID)
	require.NoError(t, err)
	assert.Equal(t, KubernetesFacts{PodUID: string(web.UID), ContainerID: appID, Namespace: ns, PodName: "web", ServiceAccount: "workload",
		Labels: map[string]string{"app": "web"}, ContainerName: "app", Image: "example.com/web:1", ImageID: "example.com/app@sha256:" + appID}, k)

	k, err = p.Lookup(ctx, string(web.UID), initID)
	require.NoError(t, err)
	assert.Equal(t, "init", k.ContainerName)

	_, err = p.Lookup(ctx, string(other.UID), otherID)
	require.ErrorIs(t, err, ErrUnknownPod, "a pod on another node")
	assert.Equal(t, codes.PermissionDenied, status.Code(Status(err)))

	_, err = p.Lookup(ctx, randomUID(t), appID)
	require.ErrorIs(t, err, ErrUnknownPod)

	_, err = p.Lookup(ctx, string(web.UID), randomHex(t, 32))
	require.ErrorIs(t, err, ErrUnknownContainer, "the sandbox, or any container not in the status")
	assert.Equal(t, codes.PermissionDenied, status.Code(Status(err)))

	// Deleted: refused once the informer saw it go.
	gone := make(chan struct{})
	_, err = p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && pod.UID == web.UID {
			close(gone)
		}
	}})
	require.NoError(t, err)
	zero := int64(0)
	require.NoError(t, env.Client.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	<-gone
	_, err = p.Lookup(ctx, string(web.UID), appID)
	require.ErrorIs(t, err, ErrUnknownPod)
}

// A container whose ID is not in the pod's status yet is waited for, and
// found when the status arrives.
func TestPodsContainerStatusLags(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	serviceAccount(t, env.Client, ns)
	node := "node-" + randomHex(t, 4)
	web := kubePod(t, env.Client, ns, "web", node)
	appID := randomHex(t, 32)

	p := newPods(t, PodsConfig{Client: env.Client, NodeName: node, Wait: callTimeout})
	waiting := make(chan struct{})
	p.missed = func() { close(waiting) }
	runPods(t, p)
	waitSynced(t, p)

	type lookup struct {
		k   KubernetesFacts
		err error
	}
	done := make(chan lookup, 1)
	go func() {
		k, err := p.Lookup(context.Background(), string(web.UID), appID)
		done <- lookup{k, err}
	}()
	<-waiting
	setStatus(t, env.Client, web, appID)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, "app", r.k.ContainerName)
}

// Before the first list the answer is Unavailable with the reason, for
// every pod: no API server answers here.
func TestPodsUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + addr})
	require.NoError(t, err)

	p := newPods(t, PodsConfig{Client: client, NodeName: "node"})
	_, err = p.Lookup(context.Background(), testUID, testCID)
	require.ErrorIs(t, err, ErrKubeUnavailable, "not running yet")

	failed := make(chan struct{})
	var once sync.Once
	p.apiFailed = func() { once.Do(func() { close(failed) }) }
	runPods(t, p)
	<-failed
	_, err = p.Lookup(context.Background(), testUID, testCID)
	require.ErrorIs(t, err, ErrKubeUnavailable)
	s := status.Convert(Status(err))
	assert.Equal(t, codes.Unavailable, s.Code())
	assert.Contains(t, s.Message(), "not listed yet")
	assert.Contains(t, s.Message(), addr, "the reason names the failure")
}

// proxy forwards TCP connections to target until cut.
type proxy struct {
	lis   net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{lis: lis}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(c, up)
			go p.pipe(up, c)
		}
	}()
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
}

// cut closes the listener and every connection: the API server is gone.
func (p *proxy) cut() {
	_ = p.lis.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// The API server becomes unreachable after the pods were listed: a pod
// Pods knows is no longer vouched for; new callers get Unavailable with
// the reason until it is back.
func TestPodsAPIServerGoesAway(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	serviceAccount(t, env.Client, ns)
	node := "node-" + randomHex(t, 4)
	appID := randomHex(t, 32)
	web := kubePod(t, env.Client, ns, "web", node, appID)

	u, err := url.Parse(env.Config.Host)
	require.NoError(t, err)
	px := newProxy(t, u.Host)
	cfg := rest.CopyConfig(env.Config)
	cfg.Host = "https://" + px.lis.Addr().String()
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	p := newPods(t, PodsConfig{Client: client, NodeName: node, Wait: 1})
	failed := make(chan struct{})
	var once sync.Once
	p.apiFailed = func() { once.Do(func() { close(failed) }) }
	runPods(t, p)
	waitSynced(t, p)
	_, err = p.Lookup(context.Background(), string(web.UID), appID)
	require.NoError(t, err)

	px.cut()
	<-failed
	_, err = p.Lookup(context.Background(), string(web.UID), appID)
	require.ErrorIs(t, err, ErrKubeUnavailable)
	s := status.Convert(Status(err))
	assert.Equal(t, codes.Unavailable, s.Code())
	assert.Contains(t, s.Message(), "cannot be watched")
}
