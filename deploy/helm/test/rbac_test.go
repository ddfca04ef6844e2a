package helmtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// How long the API server may take to load a new admission policy, and
// how often to probe for it (federation/distribution's TestKubeRBAC waits
// the same way: the API server signals nothing when a policy is in force).
const (
	policyWait = 20 * time.Second
	policyTick = 20 * time.Millisecond
)

func randomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// installRBAC renders a release of a fresh name into a fresh namespace,
// applies its service account, RBAC and admission policy to the API server
// tier, and returns a client acting as that service account, the
// namespace and the release's full name.
func installRBAC(t *testing.T, env *kubetest.Env, values map[string]any) (kubernetes.Interface, string, string) {
	t.Helper()
	ns := env.Namespace(t)
	release := randomName("r")
	out, err := renderIn(t, release, ns, kubeCapabilities(), values)
	require.NoError(t, err)
	var objs []runtime.Object
	for _, o := range kubetest.DecodeObjects(t, out) {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if o.GetNamespace() != "" && o.GetNamespace() != ns {
				continue // the events Role in default
			}
			data, err := o.MarshalJSON()
			require.NoError(t, err)
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
			require.NoError(t, err)
			objs = append(objs, obj)
		}
	}
	env.Apply(t, nil, objs)
	full := release + "-trustbridge"
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + full}
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return sa, ns, full
}

// The chart's RBAC and admission policy, installed as a release of
// another name in another namespace, let its service account write the
// federated bundles and the trust ConfigMap and nothing else: never the
// release's own config ConfigMap. pods are readable only with
// impersonation on.
func TestChartRBACLive(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	v := baseValues()
	delete(v, "namespace")
	sa, ns, full := installRBAC(t, env, v)
	cm := func(ns, name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"k": "v"}}
	}

	_, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	assert.NoError(t, err, "node proxies' pods")

	// The policy takes effect once the API server has loaded it: probe
	// with fresh names until a create it forbids is refused.
	other := env.Namespace(t)
	var last error
	refused := assert.Eventually(t, func() bool {
		_, last = sa.CoreV1().ConfigMaps(other).Create(ctx, cm(other, randomName("app-")), metav1.CreateOptions{})
		return apierrors.IsForbidden(last)
	}, policyWait, policyTick)
	require.True(t, refused, "create of another ConfigMap elsewhere: last got %v", last)
	assert.ErrorContains(t, last, "trustbridge may write only its trust ConfigMap")

	own, err := env.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm(ns, full+"-config"), metav1.CreateOptions{})
	require.NoError(t, err)
	own.Data["k"] = "evil"
	_, err = sa.CoreV1().ConfigMaps(ns).Update(ctx, own, metav1.UpdateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "update its own config: got %v", err)
	err = sa.CoreV1().ConfigMaps(ns).Delete(ctx, own.Name, metav1.DeleteOptions{})
	assert.True(t, apierrors.IsForbidden(err), "delete its own config: got %v", err)

	lkg, err := sa.CoreV1().ConfigMaps(ns).Create(ctx, cm(ns, randomName("trustbridge-lkg-")), metav1.CreateOptions{})
	require.NoError(t, err, "a federated bundle")
	lkg.Data["k"] = "v2"
	_, err = sa.CoreV1().ConfigMaps(ns).Update(ctx, lkg, metav1.UpdateOptions{})
	assert.NoError(t, err, "update a federated bundle")
	assert.NoError(t, sa.CoreV1().ConfigMaps(ns).Delete(ctx, lkg.Name, metav1.DeleteOptions{}), "delete a federated bundle")
	_, err = sa.CoreV1().ConfigMaps(other).Create(ctx, cm(other, "trustbridge-ca-root-cert"), metav1.CreateOptions{})
	assert.NoError(t, err, "the trust ConfigMap in another namespace")

	v = baseValues()
	delete(v, "namespace")
	v["policy"] = map[string]any{"caTrustedNodeAccounts": []any{}}
	noImpersonation, _, _ := installRBAC(t, env, v)
	_, err = noImpersonation.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "no impersonation, no pods: got %v", err)
}

// With distribution.rootSecret, the chart's service account may write
// that Secret in any namespace and no other Secret outside its own
// namespace; without it, it may create no Secret elsewhere at all.
func TestChartRBACLiveRootSecret(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	secret := func(ns, name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: map[string]string{"k": "v"}}
	}
	other := env.Namespace(t)

	v := baseValues()
	delete(v, "namespace")
	without, _, _ := installRBAC(t, env, v)
	_, err := without.CoreV1().Secrets(other).Create(ctx, secret(other, "trustbridge-roots"), metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "no rootSecret, no Secret elsewhere: got %v", err)

	v = baseValues()
	delete(v, "namespace")
	v["distribution"] = map[string]any{"rootSecret": "trustbridge-roots"}
	sa, ns, _ := installRBAC(t, env, v)
	var last error
	refused := assert.Eventually(t, func() bool {
		_, last = sa.CoreV1().Secrets(other).Create(ctx, secret(other, randomName("app-")), metav1.CreateOptions{})
		return apierrors.IsForbidden(last)
	}, policyWait, policyTick)
	require.True(t, refused, "create of another Secret elsewhere: last got %v", last)
	assert.ErrorContains(t, last, "trustbridge may write only its distributed trust Secret")

	s, err := sa.CoreV1().Secrets(other).Create(ctx, secret(other, "trustbridge-roots"), metav1.CreateOptions{})
	require.NoError(t, err, "the distributed Secret")
	s.StringData = map[string]string{"k": "v2"}
	_, err = sa.CoreV1().Secrets(other).Update(ctx, s, metav1.UpdateOptions{})
	assert.NoError(t, err, "update the distributed Secret")
	_, err = sa.CoreV1().Secrets(other).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=trustbridge-roots"})
	assert.NoError(t, err, "list the distributed Secret by name")
	assert.NoError(t, sa.CoreV1().Secrets(other).Delete(ctx, "trustbridge-roots", metav1.DeleteOptions{}), "delete the distributed Secret")
	_, err = sa.CoreV1().Secrets(other).List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "list every Secret: got %v", err)
	_, err = sa.CoreV1().Secrets(ns).Create(ctx, secret(ns, "trustbridge-ca"), metav1.CreateOptions{})
	assert.NoError(t, err, "its CA Secret in its own namespace")
}
