package nodeauth

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var td = spiffeid.RequireTrustDomainFromString("example.org")

func pod(ns, name, uid, sa, node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, NodeName: node},
		Status:     corev1.PodStatus{Phase: phase},
	}
}

func ztunnel(pod, uid string) authn.Identity {
	return authn.Identity{
		ID:     spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel"),
		Method: authn.MethodKubernetesJWT,
		Pod:    authn.PodRef{Namespace: "istio-system", Name: pod, UID: uid},
	}
}

func id(ns, sa string) spiffeid.ID {
	return spiffeid.RequireFromSegments(td, "ns", ns, "sa", sa)
}

// startAuthorizer runs an Authorizer over a fake API server holding pods
// and waits for its cache.
func startAuthorizer(t *testing.T, cfg Config, pods ...*corev1.Pod) (*Authorizer, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset()
	for _, p := range pods {
		_, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	cfg.Client, cfg.TrustDomain = client, td
	a, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	require.Eventually(t, a.HasSynced, 10*time.Second, 10*time.Millisecond)
	return a, client
}

func TestAuthorizeImpersonation(t *testing.T) {
	a, _ := startAuthorizer(t, Config{},
		pod("istio-system", "ztunnel-a", "uid-za", "ztunnel", "node-a", corev1.PodRunning),
		pod("istio-system", "ztunnel-b", "uid-zb", "ztunnel", "node-b", corev1.PodRunning),
		pod("shop", "web-1", "uid-w1", "web", "node-a", corev1.PodRunning),
		pod("shop", "api-1", "uid-a1", "api", "node-b", corev1.PodRunning),
		pod("shop", "job-1", "uid-j1", "batch", "node-a", corev1.PodSucceeded),
		pod("shop", "dflt-1", "uid-d1", "", "node-a", corev1.PodPending),
		pod("istio-system", "fake-ztunnel", "uid-fz", "other", "node-b", corev1.PodRunning),
	)
	web := authn.Identity{ID: id("shop", "web"), Method: authn.MethodKubernetesJWT, Pod: authn.PodRef{Namespace: "shop", Name: "web-1", UID: "uid-w1"}}
	tests := []struct {
		name   string
		caller authn.Identity
		target spiffeid.ID
		err    error
		msg    string
	}{
		{"a pod on the caller's node", ztunnel("ztunnel-a", "uid-za"), id("shop", "web"), nil, ""},
		{"the default service account", ztunnel("ztunnel-a", "uid-za"), id("shop", "default"), nil, ""},
		{"a pod on another node", ztunnel("ztunnel-a", "uid-za"), id("shop", "api"), ErrNotAuthorized, "no running pod of service account shop/api is on node node-a"},
		{"the other node's ztunnel", ztunnel("ztunnel-b", "uid-zb"), id("shop", "api"), nil, ""},
		{"a finished pod only", ztunnel("ztunnel-a", "uid-za"), id("shop", "batch"), ErrNotAuthorized, "no running pod"},
		{"not a node account", web, id("shop", "api"), ErrNotAuthorized, "not a trusted node account"},
		{"a token not bound to a pod", ztunnel("", ""), id("shop", "web"), ErrNotAuthorized, "not bound to a pod"},
		{"the pod re-created (uid differs)", ztunnel("ztunnel-a", "uid-old"), id("shop", "web"), ErrNotAuthorized, "uid differs"},
		{"a bound pod of another account", ztunnel("fake-ztunnel", "uid-fz"), id("shop", "api"), ErrNotAuthorized, "runs as other"},
		{"a pod not seen yet", ztunnel("ztunnel-new", "uid-n"), id("shop", "web"), authn.ErrUnavailable, "not seen yet"},
		{"another trust domain", ztunnel("ztunnel-a", "uid-za"), spiffeid.RequireFromString("spiffe://other.example/ns/shop/sa/web"), ErrNotAuthorized, "is not spiffe://example.org/ns/"},
		{"not a service account identity", ztunnel("ztunnel-a", "uid-za"), spiffeid.RequireFromString("spiffe://example.org/admin"), ErrNotAuthorized, "is not spiffe://"},
		{"an SVID caller", authn.Identity{ID: ztunnel("", "").ID, Method: authn.MethodX509SVID}, id("shop", "web"), ErrNotAuthorized, "only a service account token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.AuthorizeImpersonation(context.Background(), tt.caller, tt.target)
			if tt.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.err)
			assert.ErrorContains(t, err, tt.msg)
		})
	}
}

// A pod arriving on the node becomes impersonable, and one leaving stops
// being so, as soon as the watch brings the change: the informer is the
// cache. Another trusted node account is configured here.
func TestAuthorizeImpersonationFollowsPods(t *testing.T) {
	a, client := startAuthorizer(t, Config{TrustedNodeAccounts: []string{"kube-system/node-proxy"}},
		pod("kube-system", "np-a", "uid-np", "node-proxy", "node-a", corev1.PodRunning))
	caller := authn.Identity{ID: id("kube-system", "node-proxy"), Method: authn.MethodKubernetesJWT,
		Pod: authn.PodRef{Namespace: "kube-system", Name: "np-a", UID: "uid-np"}}
	authorize := func() error { return a.AuthorizeImpersonation(context.Background(), caller, id("shop", "web")) }
	require.ErrorIs(t, authorize(), ErrNotAuthorized)

	ctx := context.Background()
	_, err := client.CoreV1().Pods("shop").Create(ctx, pod("shop", "web-1", "uid-w1", "web", "node-a", corev1.PodRunning), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return authorize() == nil }, 10*time.Second, 10*time.Millisecond, "the new pod is seen")

	require.NoError(t, client.CoreV1().Pods("shop").Delete(ctx, "web-1", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return errors.Is(authorize(), ErrNotAuthorized) }, 10*time.Second, 10*time.Millisecond, "the deletion is seen")

	// istio-system/ztunnel is not trusted when other accounts are listed.
	zt := ztunnel("np-a", "uid-np")
	assert.ErrorContains(t, a.AuthorizeImpersonation(ctx, zt, id("shop", "web")), "not a trusted node account")
}

func TestNewRefusesBadConfig(t *testing.T) {
	client := fake.NewClientset()
	for name, cfg := range map[string]Config{
		"no client":        {TrustDomain: td},
		"no trust domain":  {Client: client},
		"no slash":         {Client: client, TrustDomain: td, TrustedNodeAccounts: []string{"ztunnel"}},
		"bad namespace":    {Client: client, TrustDomain: td, TrustedNodeAccounts: []string{"Istio_System/ztunnel"}},
		"bad account name": {Client: client, TrustDomain: td, TrustedNodeAccounts: []string{"istio-system/zt unnel"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(cfg)
			assert.Error(t, err)
		})
	}
}

// Without RBAC to list pods nothing is impersonable: refused as
// unavailable (the caller retries), and our log says why.
func TestAuthorizeImpersonationWithoutPods(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: access denied"))
	})
	var logs testlog.Buffer
	a, err := New(Config{Client: client, TrustDomain: td, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "RBAC: get, list, watch pods") }, 10*time.Second, 10*time.Millisecond)
	err = a.AuthorizeImpersonation(ctx, ztunnel("ztunnel-a", "uid-za"), id("shop", "web"))
	require.ErrorIs(t, err, authn.ErrUnavailable)
}
