package kubetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestReviewFor(t *testing.T) {
	t.Parallel()
	secrets := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "update"}, ResourceNames: []string{"ca"}}
	tests := []struct {
		name    string
		subject rbacv1.Subject
		ns      string
		rule    rbacv1.PolicyRule
		want    authorizationv1.SubjectAccessReviewSpec
	}{
		{"user, resource by name", rbacv1.Subject{Kind: rbacv1.UserKind, Name: "alice"}, "ns1", secrets, authorizationv1.SubjectAccessReviewSpec{
			User: "alice", Groups: []string{"system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "ns1", Verb: "get", Resource: "secrets", Name: "ca"},
		}},
		{"service account, subresource, cluster-wide", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "sys", Name: "tb"}, "",
			rbacv1.PolicyRule{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests/status"}, Verbs: []string{"update"}},
			authorizationv1.SubjectAccessReviewSpec{
				User: "system:serviceaccount:sys:tb", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:sys", "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "update", Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "status"},
			}},
		{"group, non-resource URL", rbacv1.Subject{Kind: rbacv1.GroupKind, Name: "system:unauthenticated"}, "",
			rbacv1.PolicyRule{NonResourceURLs: []string{"/openid/v1/*"}, Verbs: []string{"get"}},
			authorizationv1.SubjectAccessReviewSpec{
				User: "kubetest:rbac-probe", Groups: []string{"system:unauthenticated"},
				NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/openid/v1/", Verb: "get"},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.want, reviewFor(tt.subject, tt.ns, tt.rule).Spec)
		})
	}
}

// A Role and RoleBinding applied with Apply are in force when it returns:
// the subject's first request is allowed, the authorizer's cache having
// caught up (TestAPIServerRBAC in ca/upstream/kubecsr raced it before).
func TestApplyWaitsForRBAC(t *testing.T) {
	env := Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	user := "kubetest-rbac-" + ns
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	as, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = env.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	for i := range 5 {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r" + string(rune('0'+i))},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}, ResourceNames: []string{"cm"}}}}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		env.Apply(t, nil, []runtime.Object{role, binding})
		_, err = as.CoreV1().ConfigMaps(ns).Get(ctx, "cm", metav1.GetOptions{})
		require.NoError(t, err, "round %d: granted by Apply", i)
		require.NoError(t, env.Client.RbacV1().RoleBindings(ns).Delete(ctx, binding.Name, metav1.DeleteOptions{}))
		require.Eventually(t, func() bool {
			_, err = as.CoreV1().ConfigMaps(ns).Get(ctx, "cm", metav1.GetOptions{})
			return err != nil
		}, rbacWait, pollInterval, "round %d: the binding's removal reaches the authorizer", i)
	}
}
