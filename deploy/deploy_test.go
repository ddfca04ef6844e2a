// Package deploy holds the Kubernetes manifests; its test checks them
// against a real API server with the real kubectl.
package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/trustbridge/trustbridge/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// overlays are every kustomization users apply.
var overlays = []string{"base", "examples/two-clusters/east", "examples/two-clusters/west"}

// kubectl is the one `make kube-tools` builds next to kube-apiserver.
func kubectl(t *testing.T) string {
	t.Helper()
	path := filepath.Join(kubetest.AssetsDir(), "kubectl")
	if _, err := os.Stat(path); err != nil {
		if os.Getenv(kubetest.RequireEnv) == "require" {
			t.Fatalf("kubectl required (%s=require) but missing: %v (run make kube-tools)", kubetest.RequireEnv, err)
		}
		t.Skipf("no kubectl (run make kube-tools): %v", err)
	}
	return path
}

type cli struct {
	t          *testing.T
	bin        string
	kubeconfig string
}

func (c cli) run(stdin []byte, args ...string) (string, error) {
	c.t.Helper()
	cmd := exec.Command(c.bin, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

func (c cli) must(stdin []byte, args ...string) string {
	c.t.Helper()
	out, err := c.run(stdin, args...)
	require.NoError(c.t, err, "kubectl %s: %s", strings.Join(args, " "), out)
	return out
}

func newCLI(t *testing.T) cli {
	t.Helper()
	bin := kubectl(t)
	env := kubetest.Shared(t)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: env.Config.CertData, ClientKeyData: env.Config.KeyData, Token: env.Config.BearerToken}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return cli{t: t, bin: bin, kubeconfig: path}
}

func decode(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		var u unstructured.Unstructured
		err := d.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, "rendered manifests do not decode")
		if len(u.Object) > 0 {
			out = append(out, &u)
		}
	}
}

// Every overlay renders and passes `kubectl apply --dry-run=server`: the
// API server's validation (schemas, the CRD's OpenAPI and CEL rules,
// admission) accepts every object.
func TestApplyDryRunServer(t *testing.T) {
	k := newCLI(t)
	// Server dry-run of namespaced objects and of custom resources needs
	// the namespace and the CRD to exist.
	k.must(nil, "apply", "-f", "base/crd.yaml")
	k.must(nil, "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusterfederatedtrustdomains.trustbridge.dev")
	k.must(nil, "apply", "-f", "base/namespace.yaml")

	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			rendered := k.must(nil, "kustomize", dir)
			objs := decode(t, rendered)
			require.NotEmpty(t, objs)
			out := k.must(nil, "apply", "--dry-run=server", "-k", dir)
			assert.Equal(t, len(objs), strings.Count(out, "(server dry run)"), "every object passes: %s", out)
		})
	}

	// The dry run is not vacuous: the API server refuses a resource the
	// CRD's schema forbids.
	bad := strings.Replace(k.must(nil, "kustomize", "examples/two-clusters/east"), "https://trustbridge.west.example:8443/", "http://trustbridge.west.example/", 1)
	out, err := k.run([]byte(bad), "apply", "--dry-run=server", "-f", "-")
	require.Error(t, err)
	assert.Contains(t, out, "bundleEndpointURL")
}

// The Deployment runs as the issue and the restricted Pod Security
// Standard want it.
func TestDeploymentHardening(t *testing.T) {
	k := cli{t: t, bin: kubectl(t)}
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(k.bin, "kustomize", dir).Output()
			require.NoError(t, err)
			kinds := map[string]int{}
			var dep *unstructured.Unstructured
			for _, o := range decode(t, string(out)) {
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
