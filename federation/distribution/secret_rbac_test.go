package distribution

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// secretTestAccount stands in for trustbridge's service account in
// TestKubeRBACDistributionSecret: deploy/rbac/distribution-secret is
// bound to it rather than to trustbridge, so that TestKubeRBAC, on the
// same API server and in parallel, still sees the default permissions
// (no Secret creates outside trustbridge-system).
const secretTestAccount = "trustbridge-secret-test"

// forTestAccount rebinds the manifests of deploy/rbac/distribution-secret
// to secretTestAccount, under names of their own.
func forTestAccount(t *testing.T, objs []runtime.Object) []runtime.Object {
	t.Helper()
	user := "system:serviceaccount:" + systemNamespace + ":" + secretTestAccount
	for _, obj := range objs {
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			o.Name += "-test"
		case *rbacv1.ClusterRoleBinding:
			o.Name += "-test"
			o.RoleRef.Name += "-test"
			require.Len(t, o.Subjects, 1)
			assert.Equal(t, serviceAccount, o.Subjects[0].Name)
			o.Subjects[0].Name = secretTestAccount
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			o.Name += "-test"
			require.Len(t, o.Spec.MatchConditions, 1)
			require.Contains(t, o.Spec.MatchConditions[0].Expression, `"`+serviceAccountID+`"`)
			o.Spec.MatchConditions[0].Expression = strings.ReplaceAll(o.Spec.MatchConditions[0].Expression, serviceAccountID, user)
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			o.Name += "-test"
			o.Spec.PolicyName += "-test"
		default:
			t.Fatalf("unexpected %T in deploy/rbac/distribution-secret", obj)
		}
	}
	// The base ClusterRole (namespaces), bound to the same account.
	return append(objs, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "trustbridge-secret-test-base"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "trustbridge"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: secretTestAccount, Namespace: systemNamespace}},
	})
}

// TestKubeRBACDistributionSecret applies deploy/rbac and
// deploy/rbac/distribution-secret and acts as the service account: the
// Secret target works with exactly these permissions, and no other Secret
// can be read, or written outside its own namespace.
func TestKubeRBACDistributionSecret(t *testing.T) {
	t.Parallel()
	env := kubetest.Shared(t)
	env.Apply(t, []string{systemNamespace}, kubetest.LoadManifests(t, rbacDir))
	env.Apply(t, []string{systemNamespace}, forTestAccount(t, kubetest.LoadManifests(t, rbacDir+"/distribution-secret")))
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + systemNamespace + ":" + secretTestAccount}
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx := context.Background()

	r := newSecretRig(t, sa, DefaultName, "")
	selected := r.namespace(t, true)
	leaving := r.namespace(t, true)
	r.start(t)
	r.waitSecretCurrent(t, selected, leaving)
	require.NoError(t, env.Client.CoreV1().Secrets(selected).Delete(ctx, DefaultName, metav1.DeleteOptions{}))
	r.waitSecretCurrent(t, selected)
	r.setSelected(t, leaving, false)
	r.waitSecretGone(t, leaving)
	r.store.Set("federation", newPeerBundle(t))
	r.waitSecretCurrent(t, selected)
	assert.Equal(t, 0.0, metricValue(t, r.reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultError}))

	other := env.Namespace(t)
	_, err = env.Client.CoreV1().Secrets(other).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "app-secret"}, StringData: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	for name, do := range map[string]func() error{
		"get another Secret": func() error {
			_, err := sa.CoreV1().Secrets(other).Get(ctx, "app-secret", metav1.GetOptions{})
			return err
		},
		"list Secrets": func() error { _, err := sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err },
		"delete another Secret": func() error {
			return sa.CoreV1().Secrets(other).Delete(ctx, "app-secret", metav1.DeleteOptions{})
		},
	} {
		err := do()
		assert.True(t, apierrors.IsForbidden(err), "denied: %s: got %v", name, err)
	}

	// The admission policy pins creates to the name once the API server
	// has loaded it: each probe uses a fresh name.
	var last error
	refused := assert.Eventually(t, func() bool {
		_, last = sa.CoreV1().Secrets(other).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: randomName("app-")}}, metav1.CreateOptions{})
		return apierrors.IsForbidden(last)
	}, waitFor, tick)
	require.True(t, refused, "create of another Secret elsewhere: last got %v", last)
	assert.ErrorContains(t, last, "trustbridge may write only its distributed trust Secret")
	_, err = sa.CoreV1().Secrets(systemNamespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: randomName("trustbridge-config-")}}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "create another Secret in its namespace: got %v", err)
}
