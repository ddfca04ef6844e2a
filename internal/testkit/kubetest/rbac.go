package kubetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
)

// rbacWait bounds how long a new binding may take to reach the API
// server's RBAC authorizer. It reads roles and bindings from informer
// caches, so a request made right after the binding was created can still
// be refused; on a loaded machine that gap was long enough to fail a test.
const rbacWait = time.Minute

// pollInterval is how often a review is asked again.
const pollInterval = 100 * time.Millisecond

// WaitRBAC returns once every RoleBinding and ClusterRoleBinding among objs
// is in force: for each subject and each rule of the role it binds, a
// SubjectAccessReview, answered by the same authorizer the subject's own
// requests meet, says allowed. The role is taken from objs, or read from
// the API server. A test that grants and then acts calls this between the
// two (Apply does).
func (e *Env) WaitRBAC(t testing.TB, objs ...runtime.Object) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rbacWait)
	defer cancel()
	for _, obj := range objs {
		var ns string
		var ref rbacv1.RoleRef
		var subjects []rbacv1.Subject
		switch b := obj.(type) {
		case *rbacv1.RoleBinding:
			ns, ref, subjects = b.Namespace, b.RoleRef, b.Subjects
		case *rbacv1.ClusterRoleBinding:
			ref, subjects = b.RoleRef, b.Subjects
		default:
			continue
		}
		rules, err := e.roleRules(ctx, ns, ref, objs)
		if err != nil {
			t.Fatalf("kubetest: rules of %s %s bound in %s: %v", ref.Kind, ref.Name, ns, err)
		}
		for _, s := range subjects {
			for _, rule := range rules {
				if len(rule.NonResourceURLs) > 0 && ns != "" {
					continue // a RoleBinding grants no non-resource URLs
				}
				if err := e.waitAllowed(ctx, reviewFor(s, ns, rule)); err != nil {
					t.Fatalf("kubetest: %s %q bound to %s %s: rule %v not in force after %s: %v", s.Kind, s.Name, ref.Kind, ref.Name, rule, rbacWait, err)
				}
			}
		}
	}
}

// roleRules finds the rules of the role a binding refers to.
func (e *Env) roleRules(ctx context.Context, ns string, ref rbacv1.RoleRef, objs []runtime.Object) ([]rbacv1.PolicyRule, error) {
	for _, obj := range objs {
		switch r := obj.(type) {
		case *rbacv1.ClusterRole:
			if ref.Kind == "ClusterRole" && r.Name == ref.Name {
				return r.Rules, nil
			}
		case *rbacv1.Role:
			if ref.Kind == "Role" && r.Name == ref.Name && r.Namespace == ns {
				return r.Rules, nil
			}
		}
	}
	if ref.Kind == "ClusterRole" {
		r, err := e.Client.RbacV1().ClusterRoles().Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return r.Rules, nil
	}
	r, err := e.Client.RbacV1().Roles(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return r.Rules, nil
}

// reviewFor asks whether subject s may do the first of what rule grants,
// in namespace ns ("" for a ClusterRoleBinding: cluster-wide).
func reviewFor(s rbacv1.Subject, ns string, rule rbacv1.PolicyRule) *authorizationv1.SubjectAccessReview {
	spec := authorizationv1.SubjectAccessReviewSpec{}
	switch s.Kind {
	case rbacv1.UserKind:
		spec.User = s.Name
		spec.Groups = []string{"system:authenticated"}
	case rbacv1.GroupKind:
		spec.User = "kubetest:rbac-probe"
		spec.Groups = []string{s.Name}
	case rbacv1.ServiceAccountKind:
		spec.User = "system:serviceaccount:" + s.Namespace + ":" + s.Name
		spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + s.Namespace, "system:authenticated"}
	}
	first := func(l []string) string {
		if len(l) == 0 {
			return ""
		}
		return l[0]
	}
	if len(rule.NonResourceURLs) > 0 {
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: strings.TrimSuffix(first(rule.NonResourceURLs), "*"), Verb: first(rule.Verbs)}
		return &authorizationv1.SubjectAccessReview{Spec: spec}
	}
	resource, sub, _ := strings.Cut(first(rule.Resources), "/")
	spec.ResourceAttributes = &authorizationv1.ResourceAttributes{
		Namespace: ns, Verb: first(rule.Verbs), Group: first(rule.APIGroups),
		Resource: resource, Subresource: sub, Name: first(rule.ResourceNames),
	}
	return &authorizationv1.SubjectAccessReview{Spec: spec}
}

// waitAllowed polls a SubjectAccessReview until it is allowed: the
// authorizer's caches give no signal of their own.
func (e *Env) waitAllowed(ctx context.Context, sar *authorizationv1.SubjectAccessReview) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		got, err := e.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("denied: %q %q", got.Status.Reason, got.Status.EvaluationError)
		return got.Status.Allowed, nil
	})
	if err != nil && last != "" {
		return fmt.Errorf("%w (last review %s)", err, last)
	}
	return err
}
