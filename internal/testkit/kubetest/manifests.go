package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// LoadManifests decodes every object of the files dir/kustomization.yaml
// lists, as typed objects.
func LoadManifests(t testing.TB, dir string) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := utilyaml.Unmarshal(raw, &k); err != nil || len(k.Resources) == 0 {
		t.Fatalf("kubetest: %s/kustomization.yaml lists no resources (%v)", dir, err)
	}
	var objs []runtime.Object
	for _, file := range k.Resources {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("kubetest: %s: %v", file, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("kubetest: %s: %v", file, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

// Apply creates the namespaces named and the objects, leaving objects that
// already exist (the API server outlives one -count iteration), and
// returns once the RBAC bindings among them are in force (WaitRBAC). It
// knows the kinds deploy/ uses.
func (e *Env) Apply(t testing.TB, namespaces []string, objs []runtime.Object) {
	t.Helper()
	ctx := context.Background()
	c := e.Client
	for _, ns := range namespaces {
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("kubetest: create namespace %s: %v", ns, err)
		}
	}
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("kubetest: Apply does not know objects of type %T", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("kubetest: create %T: %v", obj, err)
		}
	}
	e.WaitRBAC(t, objs...)
}
