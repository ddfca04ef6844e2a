package deploy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/trustbridge/trustbridge/federation/distribution"
	"github.com/trustbridge/trustbridge/federation/kubelkg"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// The server's service account may do to ClusterFederatedTrustDomain
// resources exactly what the server does: the controller watches them
// and writes their status; federation add|remove and bundle set through
// the admin API create, update and delete them (federation/crd/manage.go).
// These ran into 403 on a real install when the role granted only reads.
func TestServerRBACClusterFederatedTrustDomains(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "trustbridge-system"
	env.Apply(t, []string{ns}, kubetest.LoadManifests(t, "rbac"))
	sa := "system:serviceaccount:" + ns + ":trustbridge"

	tests := []struct {
		verb, subresource string
		allowed           bool
	}{
		{"get", "", true}, {"list", "", true}, {"watch", "", true},
		{"create", "", true}, {"update", "", true}, {"delete", "", true},
		{"update", "status", true}, {"patch", "status", true},
		// Nothing the server does not do.
		{"patch", "", false}, {"deletecollection", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.verb+"/"+tt.subresource, func(t *testing.T) {
			review, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authzv1.SubjectAccessReview{
				Spec: authzv1.SubjectAccessReviewSpec{
					User:   sa,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
					ResourceAttributes: &authzv1.ResourceAttributes{
						Group: "trustbridge.dev", Resource: "clusterfederatedtrustdomains", Subresource: tt.subresource,
						Verb: tt.verb, Name: "east.example",
					},
				},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.Equal(t, tt.allowed, review.Status.Allowed, "%s: %s", tt.verb, review.Status.Reason)
		})
	}
}

// The server's service account reads ClusterTrustPolicy resources and
// writes their status, and nothing else: it never makes trust policy. It
// lists and watches service accounts in every namespace for the labels
// trust policy rules select by.
func TestServerRBACClusterTrustPolicies(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "trustbridge-system"
	env.Apply(t, []string{ns}, kubetest.LoadManifests(t, "rbac"))
	sa := "system:serviceaccount:" + ns + ":trustbridge"

	tests := []struct {
		group, resource, subresource, verb string
		allowed                            bool
	}{
		{"trustbridge.dev", "clustertrustpolicies", "", "get", true},
		{"trustbridge.dev", "clustertrustpolicies", "", "list", true},
		{"trustbridge.dev", "clustertrustpolicies", "", "watch", true},
		{"trustbridge.dev", "clustertrustpolicies", "status", "update", true},
		{"trustbridge.dev", "clustertrustpolicies", "status", "patch", true},
		{"", "serviceaccounts", "", "list", true},
		{"", "serviceaccounts", "", "watch", true},
		// trustbridge never makes trust policy.
		{"trustbridge.dev", "clustertrustpolicies", "", "create", false},
		{"trustbridge.dev", "clustertrustpolicies", "", "update", false},
		{"trustbridge.dev", "clustertrustpolicies", "", "patch", false},
		{"trustbridge.dev", "clustertrustpolicies", "", "delete", false},
		{"", "serviceaccounts", "", "update", false},
	}
	for _, tt := range tests {
		t.Run(tt.resource+"/"+tt.subresource+"/"+tt.verb, func(t *testing.T) {
			review, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authzv1.SubjectAccessReview{
				Spec: authzv1.SubjectAccessReviewSpec{
					User:   sa,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
					ResourceAttributes: &authzv1.ResourceAttributes{
						Group: tt.group, Resource: tt.resource, Subresource: tt.subresource, Verb: tt.verb, Name: "payments-to-partner",
					},
				},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.Equal(t, tt.allowed, review.Status.Allowed, "%s %s: %s", tt.verb, tt.resource, review.Status.Reason)
		})
	}
}

// csrRules are the ClusterRole trustbridge's rules on
// certificatesigningrequests in the kustomization dir renders.
func csrRules(t *testing.T, k *kubetest.Kubectl, dir string) (csr []any, all int) {
	t.Helper()
	for _, o := range kubetest.DecodeObjects(t, k.Must(nil, "kustomize", dir)) {
		if o.GetKind() != "ClusterRole" || o.GetName() != "trustbridge" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			if slices.Contains(r.(map[string]any)["resources"].([]any), any("certificatesigningrequests")) {
				csr = append(csr, r)
			}
		}
		return csr, len(rules)
	}
	require.FailNow(t, "no ClusterRole trustbridge", dir)
	return nil, 0
}

// --upstream kube-csr needs create, get, watch and delete on
// CertificateSigningRequests; only examples/upstream-kube-csr grants them,
// as one rule added to the base's, never approve or sign.
func TestUpstreamKubeCSROverlayRBAC(t *testing.T) {
	k := kubetest.OfflineKubectl(t)
	csr, n := csrRules(t, k, "examples/upstream-kube-csr")
	assert.Equal(t, []any{map[string]any{
		"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"certificatesigningrequests"},
		"verbs": []any{"create", "get", "watch", "delete"},
	}}, csr)
	baseCSR, baseN := csrRules(t, k, "base")
	assert.Empty(t, baseCSR, "least privilege: the base grants no CSR access")
	assert.Equal(t, baseN+1, n, "the overlay adds one rule and changes none")
	for _, dir := range overlays {
		if dir != "examples/upstream-kube-csr" {
			got, _ := csrRules(t, k, dir)
			assert.Empty(t, got, dir)
		}
	}
}

// The server's service account reads ClusterIdentityMapping resources and
// writes their status, and never makes one: identity map rules are the
// operator's.
func TestServerRBACClusterIdentityMappings(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "trustbridge-system"
	env.Apply(t, []string{ns}, kubetest.LoadManifests(t, "rbac"))
	sa := "system:serviceaccount:" + ns + ":trustbridge"
	tests := []struct {
		subresource, verb string
		allowed           bool
	}{
		{"", "get", true}, {"", "list", true}, {"", "watch", true},
		{"status", "update", true}, {"status", "patch", true},
		{"", "create", false}, {"", "update", false}, {"", "patch", false}, {"", "delete", false},
	}
	for _, tt := range tests {
		t.Run(tt.subresource+"/"+tt.verb, func(t *testing.T) {
			review, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authzv1.SubjectAccessReview{
				Spec: authzv1.SubjectAccessReviewSpec{
					User:   sa,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
					ResourceAttributes: &authzv1.ResourceAttributes{
						Group: "trustbridge.dev", Resource: "clusteridentitymappings", Subresource: tt.subresource, Verb: tt.verb, Name: "pay-apps",
					},
				},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.Equal(t, tt.allowed, review.Status.Allowed, "%s: %s", tt.verb, review.Status.Reason)
		})
	}
}

// Each overlay's ClusterRole grants pods get, list and watch only when its
// server watches pods: when node proxies may ask for their pods'
// certificates (ca-trusted-node-accounts, istio-system/ztunnel when the
// config leaves it out; an empty list turns it off).
func TestPodsRuleFollowsServerConfig(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			_, cfg, objs := overlayObjects(t, dir)
			accounts, set := cfg["ca-trusted-node-accounts"].([]any)
			impersonation := !set || len(accounts) > 0
			var pods []any
			for _, o := range objs {
				if o.GetKind() != "ClusterRole" || o.GetName() != "trustbridge" {
					continue
				}
				rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
				for _, r := range rules {
					if slices.Contains(r.(map[string]any)["resources"].([]any), any("pods")) {
						pods = append(pods, r.(map[string]any)["verbs"])
					}
				}
			}
			if impersonation {
				assert.Equal(t, []any{[]any{"get", "list", "watch"}}, pods, "node proxies' pods are watched")
			} else {
				assert.Empty(t, pods, "no impersonation, no pods")
			}
		})
	}
}

// RBAC has no name prefixes, so the Role's ConfigMap rule covers the whole
// namespace; the admission policy of each overlay pins creates, updates
// and deletes to the names the code writes (distribution's trust
// ConfigMap, kubelkg's federated bundles), which the server's own config
// ConfigMap is not.
func TestAdmissionPolicyPinsConfigMapWrites(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			_, _, objs := overlayObjects(t, dir)
			var expr string
			var ops []any
			var configName string
			for _, o := range objs {
				switch o.GetKind() {
				case "ValidatingAdmissionPolicy":
					val, _, _ := unstructured.NestedSlice(o.Object, "spec", "validations")
					require.Len(t, val, 1)
					expr = val[0].(map[string]any)["expression"].(string)
					rules, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConstraints", "resourceRules")
					require.Len(t, rules, 1)
					ops = rules[0].(map[string]any)["operations"].([]any)
				case "ConfigMap":
					if _, found, _ := unstructured.NestedString(o.Object, "data", "config.yaml"); found {
						configName = o.GetName()
					}
				}
			}
			assert.ElementsMatch(t, []any{"CREATE", "UPDATE", "DELETE"}, ops)
			assert.Contains(t, expr, `variables.name == "`+distribution.DefaultName+`"`)
			assert.Contains(t, expr, `variables.name.startsWith("`+kubelkg.DefaultPrefix+`")`)
			require.NotEmpty(t, configName)
			assert.False(t, strings.HasPrefix(configName, kubelkg.DefaultPrefix) || configName == distribution.DefaultName,
				"the policy lets trustbridge write its own config %s", configName)
		})
	}
}
