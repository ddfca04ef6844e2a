// Package deploy holds the Kubernetes manifests; its test checks them
// against a real API server with the real kubectl.
package deploy

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// overlays are every kustomization users apply.
var overlays = []string{"base", "examples/two-clusters/east", "examples/two-clusters/west", "examples/upstream-kube-csr"}

// Every overlay renders and passes `kubectl apply --dry-run=server`: the
// API server's validation (schemas, the CRD's OpenAPI and CEL rules,
// admission) accepts every object.
func TestApplyDryRunServer(t *testing.T) {
	k := kubetest.Shared(t).Kubectl(t)
	// Server dry-run of namespaced objects and of custom resources needs
	// the namespace and the CRD to exist.
	k.Must(nil, "apply", "-f", "base/crd.yaml", "-f", "base/trustpolicy-crd.yaml")
	k.Must(nil, "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusterfederatedtrustdomains.trustbridge.dev",
		"crd/clustertrustpolicies.trustbridge.dev")
	k.Must(nil, "apply", "-f", "base/namespace.yaml")

	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			rendered := k.Must(nil, "kustomize", dir)
			objs := kubetest.DecodeObjects(t, rendered)
			require.NotEmpty(t, objs)
			out := k.Must(nil, "apply", "--dry-run=server", "-k", dir)
			assert.Equal(t, len(objs), strings.Count(out, "(server dry run)"), "every object passes: %s", out)
		})
	}

	// The dry run is not vacuous: the API server refuses a resource the
	// CRD's schema forbids.
	bad := strings.Replace(k.Must(nil, "kustomize", "examples/two-clusters/east"), "https://trustbridge.west.example:8443/", "http://trustbridge.west.example/", 1)
	out, err := k.Run([]byte(bad), "apply", "--dry-run=server", "-f", "-")
	require.Error(t, err)
	assert.Contains(t, out, "bundleEndpointURL")
}

// The Deployment runs as the issue and the restricted Pod Security
// Standard want it.
func TestDeploymentHardening(t *testing.T) {
	k := kubetest.OfflineKubectl(t)
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			out := k.Must(nil, "kustomize", dir)
			kinds := map[string]int{}
			var dep *unstructured.Unstructured
			for _, o := range kubetest.DecodeObjects(t, out) {
				kinds[o.GetKind()]++
				if o.GetKind() == "Deployment" {
					dep = o
				}
			}
			for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
				"CustomResourceDefinition", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"} {
				assert.NotZero(t, kinds[kind], "a %s", kind)
			}
			assert.Equal(t, 2, kinds["Service"], "bundle endpoint and gRPC")
			require.NotNil(t, dep)
			replicas, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas")
			assert.EqualValues(t, 2, replicas)
			pod, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
			nonRoot, _, _ := unstructured.NestedBool(pod, "securityContext", "runAsNonRoot")
			assert.True(t, nonRoot)
			seccomp, _, _ := unstructured.NestedString(pod, "securityContext", "seccompProfile", "type")
			assert.Equal(t, "RuntimeDefault", seccomp)
			containers, _, _ := unstructured.NestedSlice(pod, "containers")
			require.NotEmpty(t, containers)
			for _, c := range containers {
				c := c.(map[string]any)
				ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem")
				assert.True(t, ro, "read-only root file system")
				esc, found, _ := unstructured.NestedBool(c, "securityContext", "allowPrivilegeEscalation")
				assert.True(t, found && !esc)
				drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop")
				assert.Equal(t, []string{"ALL"}, drop)
				cpu, _, _ := unstructured.NestedString(c, "resources", "requests", "cpu")
				mem, _, _ := unstructured.NestedString(c, "resources", "requests", "memory")
				assert.NotEmpty(t, cpu)
				assert.NotEmpty(t, mem)
				for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
					got, _, _ := unstructured.NestedString(c, probe, "httpGet", "path")
					assert.Equal(t, path, got, probe)
				}
			}
		})
	}
}
