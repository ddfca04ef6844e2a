package attest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

const fakeNode = "node-a"

func fakePod(ns, name, uid, node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: name + "-sa", Containers: []corev1.Container{{Name: "app", Image: "example.com/app:1"}}},
		Status:     corev1.PodStatus{Phase: phase},
	}
}

// fakePods runs Pods for fakeNode over a fake API server holding pods and
// waits for its first list. The fake ignores field selectors: Pods gets
// every node's pods, and must tell them apart itself. watching receives
// once the informer's watch is registered, so that a change made after
// it reaches the informer.
func fakePods(t *testing.T, wait time.Duration, pods ...*corev1.Pod) (p *Pods, client *fake.Clientset, watching <-chan struct{}) {
	t.Helper()
	objs := make([]runtime.Object, len(pods))
	for i, pod := range pods {
		objs[i] = pod
	}
	client = fake.NewClientset(objs...)
	w := make(chan struct{}, 1)
	client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		wi, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		select {
		case w <- struct{}{}:
		default:
		}
		return true, wi, err
	})
	p = newPods(t, PodsConfig{Client: client, NodeName: fakeNode, Wait: wait})
	runPods(t, p)
	waitSynced(t, p)
	return p, client, w
}

func TestLookupPod(t *testing.T) {
	terminating := fakePod("shop", "leaving", "uid-leaving", fakeNode, corev1.PodRunning)
	deleted := metav1.NewTime(time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC))
	terminating.DeletionTimestamp = &deleted
	p, _, _ := fakePods(t, 1,
		fakePod("shop", "web", "uid-web", fakeNode, corev1.PodRunning),
		fakePod("shop", "starting", "uid-starting", fakeNode, corev1.PodPending),
		fakePod("shop", "api", "uid-api", "node-b", corev1.PodRunning),
		fakePod("shop", "job", "uid-job", fakeNode, corev1.PodSucceeded),
		fakePod("shop", "crashed", "uid-crashed", fakeNode, corev1.PodFailed),
		terminating,
	)
	web := KubernetesFacts{PodUID: "uid-web", Namespace: "shop", PodName: "web", ServiceAccount: "web-sa", Labels: map[string]string{"app": "web"}}
	tests := []struct {
		name string
		ref  PodRef
		want KubernetesFacts
		err  error
		msg  string
	}{
		{"by UID", PodRef{UID: "uid-web"}, web, nil, ""},
		{"by name", PodRef{Namespace: "shop", Name: "web"}, web, nil, ""},
		{"by both", PodRef{Namespace: "shop", Name: "web", UID: "uid-web"}, web, nil, ""},
		{"by UID and name", PodRef{Name: "web", UID: "uid-web"}, web, nil, ""},
		{"not started yet", PodRef{UID: "uid-starting"}, KubernetesFacts{PodUID: "uid-starting", Namespace: "shop", PodName: "starting",
			ServiceAccount: "starting-sa", Labels: map[string]string{"app": "starting"}}, nil, ""},
		{"re-created: another UID", PodRef{Namespace: "shop", Name: "web", UID: "uid-old"}, KubernetesFacts{}, ErrUnknownPod,
			"pod shop/web (uid-old) is not on node node-a: the pod there is shop/web (uid-web)"},
		{"UID in another namespace", PodRef{Namespace: "other", Name: "web", UID: "uid-web"}, KubernetesFacts{}, ErrUnknownPod, "not on node node-a"},
		{"UID of another name", PodRef{Name: "api", UID: "uid-web"}, KubernetesFacts{}, ErrUnknownPod, "the pod there is shop/web"},
		{"on another node, by UID", PodRef{UID: "uid-api"}, KubernetesFacts{}, ErrUnknownPod, "pod uid-api is not on node node-a"},
		{"on another node, by name", PodRef{Namespace: "shop", Name: "api"}, KubernetesFacts{}, ErrUnknownPod, "pod shop/api is not on node node-a"},
		{"unknown", PodRef{UID: "uid-none"}, KubernetesFacts{}, ErrUnknownPod, "not on node node-a"},
		{"terminating", PodRef{UID: "uid-leaving"}, KubernetesFacts{}, ErrPodNotRunning,
			"pod shop/leaving (uid-leaving) on node node-a is terminating (deletion requested at 2026-12-06T08:00:00Z)"},
		{"succeeded", PodRef{Namespace: "shop", Name: "job"}, KubernetesFacts{}, ErrPodNotRunning, "has finished (phase Succeeded)"},
		{"failed", PodRef{UID: "uid-crashed"}, KubernetesFacts{}, ErrPodNotRunning, "has finished (phase Failed)"},
		{"empty", PodRef{}, KubernetesFacts{}, ErrInvalidPodRef, "name a pod by its UID, or by its namespace and name"},
		{"name only", PodRef{Name: "web"}, KubernetesFacts{}, ErrInvalidPodRef, `namespace "", name "web", uid ""`},
		{"namespace only", PodRef{Namespace: "shop"}, KubernetesFacts{}, ErrInvalidPodRef, `namespace "shop", name ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := p.LookupPod(context.Background(), tt.ref)
			if tt.err == nil {
				require.NoError(t, err)
				assert.Equal(t, tt.want, k)
				return
			}
			require.ErrorIs(t, err, tt.err)
			assert.ErrorContains(t, err, tt.msg)
			want := codes.PermissionDenied
			if errors.Is(err, ErrInvalidPodRef) {
				want = codes.InvalidArgument
			}
			assert.Equal(t, want, status.Code(Status(err)))
		})
	}

	k, err := p.LookupPod(context.Background(), PodRef{UID: "uid-web"})
	require.NoError(t, err)
	k.Labels["app"] = "changed"
	k, err = p.LookupPod(context.Background(), PodRef{UID: "uid-web"})
	require.NoError(t, err)
	assert.Equal(t, "web", k.Labels["app"], "the cached pod is not shared")
}

// A pod not known yet is waited for, found once the watch brings it; the
// change closes its ChangedPod and ChangedAccount channels too, and no
// other pod's or account's.
func TestLookupPodWaits(t *testing.T) {
	p, client, watching := fakePods(t, callTimeout)
	waiting := make(chan struct{})
	p.missed = func() { close(waiting) }
	changed, account := p.ChangedPod("uid-web"), p.ChangedAccount("shop", "web-sa")
	otherPod, otherAccount := p.ChangedPod("uid-other"), p.ChangedAccount("shop", "other-sa")

	type lookup struct {
		k   KubernetesFacts
		err error
	}
	done := make(chan lookup, 1)
	go func() {
		k, err := p.LookupPod(context.Background(), PodRef{Namespace: "shop", Name: "web", UID: "uid-web"})
		done <- lookup{k, err}
	}()
	<-waiting
	<-watching
	assert.False(t, isClosed(changed), "nothing changed yet")
	_, err := client.CoreV1().Pods("shop").Create(context.Background(), fakePod("shop", "web", "uid-web", fakeNode, corev1.PodRunning), metav1.CreateOptions{})
	require.NoError(t, err)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, "web-sa", r.k.ServiceAccount)
	<-changed
	<-account
	assert.NotEqual(t, changed, p.ChangedPod("uid-web"), "a new channel for the next change")
	assert.False(t, isClosed(otherPod), "another pod's")
	assert.False(t, isClosed(otherAccount), "another account's")
}

// A caller that gives up while its pod is waited for gets its context's
// error, naming what it waited for.
func TestLookupPodCancelled(t *testing.T) {
	p, _, _ := fakePods(t, callTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	p.missed = cancel
	_, err := p.LookupPod(ctx, PodRef{Namespace: "shop", Name: "web"})
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "waiting for pod shop/web")
}

// While the pods cannot be listed every lookup is Unavailable, with the
// reason and the node.
func TestLookupPodAPIDown(t *testing.T) {
	client := fake.NewClientset(fakePod("shop", "web", "uid-web", fakeNode, corev1.PodRunning))
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	p := newPods(t, PodsConfig{Client: client, NodeName: fakeNode, Wait: callTimeout})
	failed := make(chan struct{})
	var once sync.Once
	p.apiFailed = func() { once.Do(func() { close(failed) }) }
	runPods(t, p)
	<-failed
	_, err := p.LookupPod(context.Background(), PodRef{UID: "uid-web"})
	require.ErrorIs(t, err, ErrKubeUnavailable)
	s := status.Convert(Status(err))
	assert.Equal(t, codes.Unavailable, s.Code())
	assert.Contains(t, s.Message(), "node node-a's pods not listed yet")
	assert.Contains(t, s.Message(), "connection refused", "the reason")
}

// Against a real API server: a pod on this node found by UID and by
// name; once its deletion is requested (no kubelet here finishes it) it is
// terminating, and refused.
func TestLookupPodReal(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	serviceAccount(t, env.Client, ns)
	node := "node-" + randomHex(t, 4)
	web := kubePod(t, env.Client, ns, "web", node)
	other := kubePod(t, env.Client, ns, "other", "node-"+randomHex(t, 4))

	p := newPods(t, PodsConfig{Client: env.Client, NodeName: node, Wait: 1})
	runPods(t, p)
	waitSynced(t, p)
	ctx := context.Background()
	want := KubernetesFacts{PodUID: string(web.UID), Namespace: ns, PodName: "web", ServiceAccount: "workload", Labels: map[string]string{"app": "web"}}
	for _, ref := range []PodRef{{UID: string(web.UID)}, {Namespace: ns, Name: "web"}, {Namespace: ns, Name: "web", UID: string(web.UID)}} {
		k, err := p.LookupPod(ctx, ref)
		require.NoError(t, err, ref)
		assert.Equal(t, want, k, ref)
	}
	_, err := p.LookupPod(ctx, PodRef{UID: string(other.UID)})
	require.ErrorIs(t, err, ErrUnknownPod, "a pod on another node")

	grace := int64(3600)
	require.NoError(t, env.Client.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &grace}))
	t.Cleanup(func() {
		zero := int64(0)
		_ = env.Client.CoreV1().Pods(ns).Delete(context.Background(), "web", metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	for {
		changed := p.ChangedPod(string(web.UID))
		_, err = p.LookupPod(ctx, PodRef{UID: string(web.UID)})
		if err != nil {
			break
		}
		<-changed
	}
	require.ErrorIs(t, err, ErrPodNotRunning)
	assert.ErrorContains(t, err, "is terminating")
}

// PodsOf finds this node's running pods of a service account, and no
// other: another node's, another account's, a terminating or finished one.
func TestPodsOf(t *testing.T) {
	a1 := fakePod("shop", "web", "00000000-0000-0000-0000-000000000001", fakeNode, corev1.PodRunning)
	a2 := fakePod("shop", "web2", "00000000-0000-0000-0000-000000000002", fakeNode, corev1.PodPending)
	a2.Spec.ServiceAccountName = "web-sa"
	elsewhere := fakePod("shop", "web3", "00000000-0000-0000-0000-000000000003", "node-b", corev1.PodRunning)
	elsewhere.Spec.ServiceAccountName = "web-sa"
	done := fakePod("shop", "web4", "00000000-0000-0000-0000-000000000004", fakeNode, corev1.PodSucceeded)
	done.Spec.ServiceAccountName = "web-sa"
	going := fakePod("shop", "web5", "00000000-0000-0000-0000-000000000005", fakeNode, corev1.PodRunning)
	going.Spec.ServiceAccountName = "web-sa"
	now := metav1.Now()
	going.DeletionTimestamp = &now
	going.Finalizers = []string{"example.com/hold"}
	other := fakePod("other", "web", "00000000-0000-0000-0000-000000000006", fakeNode, corev1.PodRunning)
	other.Spec.ServiceAccountName = "web-sa"
	p, _, _ := fakePods(t, time.Second, a1, a2, elsewhere, done, going, other)

	got, err := p.PodsOf("shop", "web-sa")
	require.NoError(t, err)
	var names []string
	for _, k := range got {
		names = append(names, k.PodName)
		assert.Empty(t, k.ContainerID)
		assert.Equal(t, "web-sa", k.ServiceAccount)
	}
	assert.ElementsMatch(t, []string{"web", "web2"}, names)

	got, err = p.PodsOf("shop", "nobody")
	require.NoError(t, err)
	assert.Empty(t, got)
}
