package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// agentDirs are the node agent's kustomizations, applied after base.
var agentDirs = []string{"agent", "agent/csi-driver"}

const agentNamespace = "trustbridge-agent"

// Both pass `kubectl apply --dry-run=server` in the agent's namespace,
// whose privileged Pod Security level the API server enforces.
func TestAgentApplyDryRunServer(t *testing.T) {
	k := kubetest.Shared(t).Kubectl(t)
	k.Must(nil, "apply", "-f", "agent/namespace.yaml", "-f", "base/namespace.yaml")
	for _, dir := range agentDirs {
		t.Run(dir, func(t *testing.T) {
			objs := kubetest.DecodeObjects(t, k.Must(nil, "kustomize", dir))
			require.NotEmpty(t, objs)
			// No warning either: Pod Security warns on a DaemonSet whose
			// pods its namespace's level would refuse.
			out := k.Must(nil, "apply", "--dry-run=server", "--warnings-as-errors", "-k", dir)
			assert.Equal(t, len(objs), strings.Count(out, "(server dry run)"), "every object passes: %s", out)
		})
	}

	// The dry run is not vacuous: the restricted level, the server's
	// namespace's, refuses the agent's pods.
	ds := k.Must(nil, "kustomize", "agent")
	ds = ds[strings.Index(ds, "apiVersion: apps/v1"):]
	out, err := k.Run([]byte(strings.ReplaceAll(ds, "namespace: "+agentNamespace, "namespace: trustbridge-system")), "apply", "--dry-run=server", "--warnings-as-errors", "-f", "-")
	require.Error(t, err, out)
	assert.Contains(t, out, `would violate PodSecurity "restricted:latest": host namespaces (hostPID=true)`)
}

// daemonSet is the DaemonSet named name that dir renders, and its pod spec.
func daemonSet(t *testing.T, k *kubetest.Kubectl, dir, name string) map[string]any {
	t.Helper()
	for _, o := range kubetest.DecodeObjects(t, k.Must(nil, "kustomize", dir)) {
		if o.GetKind() == "DaemonSet" && o.GetName() == name {
			pod, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
			return pod
		}
	}
	require.FailNow(t, "no DaemonSet", "%s in %s", name, dir)
	return nil
}

// The agent has what attestation needs and nothing else: the host's pid
// namespace, not its network; uid 0 without a single capability (to create
// its socket in the kubelet's root-owned directory); one hostPath, the
// socket directory; a token for the server's audience; probes on its
// admin port.
func TestAgentHardening(t *testing.T) {
	k := kubetest.OfflineKubectl(t)
	pod := daemonSet(t, k, "agent", "trustbridge-agent")
	assert.Equal(t, true, pod["hostPID"])
	for _, field := range []string{"hostNetwork", "hostIPC", "shareProcessNamespace"} {
		assert.NotContains(t, pod, field)
	}
	seccomp, _, _ := unstructured.NestedString(pod, "securityContext", "seccompProfile", "type")
	assert.Equal(t, "RuntimeDefault", seccomp)
	uid, _, _ := unstructured.NestedInt64(pod, "securityContext", "runAsUser")
	assert.Zero(t, uid)

	containers := pod["containers"].([]any)
	require.Len(t, containers, 1)
	c := containers[0].(map[string]any)
	sc := c["securityContext"].(map[string]any)
	assert.Equal(t, map[string]any{
		"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": map[string]any{"drop": []any{"ALL"}},
	}, sc, "no capability added, not privileged")
	for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"} {
		got, _, _ := unstructured.NestedString(c, probe, "httpGet", "path")
		assert.Equal(t, path, got, probe)
	}
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	assert.Subset(t, args, []string{"agent", "--node", "--sds-socket=/run/trustbridge/sockets/socket", "--token-file=/var/run/secrets/tokens/trustbridge",
		"--root-cert=/var/run/secrets/trustbridge/root-cert.pem", "--ca-addr=trustbridge.trustbridge-system.svc:15012"})
	assert.NotContains(t, args, "--attest-binary", "it would need SYS_PTRACE")
	env, _, _ := unstructured.NestedSlice(c, "env")
	assert.Contains(t, env, map[string]any{"name": "NODE_NAME", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "spec.nodeName"}}})

	var hostPaths []any
	vols := map[string]map[string]any{}
	for _, v := range pod["volumes"].([]any) {
		v := v.(map[string]any)
		vols[v["name"].(string)] = v
		if hp, ok := v["hostPath"]; ok {
			hostPaths = append(hostPaths, hp)
		}
	}
	assert.Equal(t, []any{map[string]any{"path": "/run/trustbridge/sockets", "type": "DirectoryOrCreate"}}, hostPaths, "the socket directory only")
	token, _, _ := unstructured.NestedSlice(vols["token"], "projected", "sources")
	require.Len(t, token, 1)
	aud, _, _ := unstructured.NestedString(token[0].(map[string]any), "serviceAccountToken", "audience")
	assert.Equal(t, baseConfig(t)["trust-domain"], aud, "the server's token-audience default: its trust domain")
	cm, _, _ := unstructured.NestedString(vols["root-cert"], "configMap", "name")
	assert.Equal(t, "trustbridge-ca-root-cert", cm, "the roots the server distributes to every namespace")

	// The namespace admits it, and says so.
	for _, o := range kubetest.DecodeObjects(t, k.Must(nil, "kustomize", "agent")) {
		if o.GetKind() == "Namespace" {
			assert.Equal(t, "privileged", o.GetLabels()["pod-security.kubernetes.io/enforce"])
		}
	}
}

// baseConfig is deploy/base's server config.
func baseConfig(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile("base/config.yaml")
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal(data, &cfg))
	return cfg
}

// The server trusts the agent's service account to ask for its node's
// pods' certificates, and still ztunnel; its NetworkPolicy lets the agent
// reach the certificate service.
func TestBaseTrustsAgent(t *testing.T) {
	assert.Equal(t, []any{"istio-system/ztunnel", agentNamespace + "/trustbridge-agent"}, baseConfig(t)["ca-trusted-node-accounts"])
	k := kubetest.OfflineKubectl(t)
	for _, o := range kubetest.DecodeObjects(t, k.Must(nil, "kustomize", "base")) {
		if o.GetKind() != "NetworkPolicy" {
			continue
		}
		ingress, _, _ := unstructured.NestedSlice(o.Object, "spec", "ingress")
		open := false
		for _, rule := range ingress {
			rule := rule.(map[string]any)
			if _, restricted := rule["from"]; restricted {
				continue
			}
			for _, p := range rule["ports"].([]any) {
				open = open || fmt.Sprint(p.(map[string]any)["port"]) == "15012"
			}
		}
		assert.True(t, open, "15012 open to every source, the agent's pods among them: %v", ingress)
	}
}

// The CSI driver: privileged is its driver container alone (its mounts
// must propagate to the host); the registrar drops every capability.
func TestCSIDriverHardening(t *testing.T) {
	k := kubetest.OfflineKubectl(t)
	pod := daemonSet(t, k, "agent/csi-driver", "trustbridge-csi-driver")
	assert.Equal(t, false, pod["automountServiceAccountToken"], "it needs no API access")
	assert.NotContains(t, pod, "hostPID")
	assert.NotContains(t, pod, "hostNetwork")
	for _, c := range pod["containers"].([]any) {
		c := c.(map[string]any)
		ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem")
		assert.True(t, ro, c["name"])
		privileged, _, _ := unstructured.NestedBool(c, "securityContext", "privileged")
		if c["name"] == "spiffe-csi-driver" {
			assert.True(t, privileged)
			mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
			assert.Contains(t, mounts, map[string]any{"name": "agent-sockets", "mountPath": "/trustbridge-agent-sockets", "readOnly": true})
			assert.Contains(t, c["args"], "-workload-api-socket-dir=/trustbridge-agent-sockets")
			continue
		}
		assert.False(t, privileged, c["name"])
		drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop")
		assert.Equal(t, []string{"ALL"}, drop, c["name"])
	}
	var sockets map[string]any
	for _, v := range pod["volumes"].([]any) {
		if v.(map[string]any)["name"] == "agent-sockets" {
			sockets = v.(map[string]any)["hostPath"].(map[string]any)
		}
	}
	assert.Equal(t, "/run/trustbridge/sockets", sockets["path"], "the agent's socket directory")
}

// The agent's service account may read pods and do nothing else: no
// Secrets, no writes, no exec. Checked by the API server's own authorizer.
func TestAgentRBAC(t *testing.T) {
	env := kubetest.Shared(t)
	var objs []runtime.Object
	for _, o := range kubetest.LoadManifests(t, "agent") {
		switch o.(type) {
		case *corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			objs = append(objs, o)
		}
	}
	require.Len(t, objs, 3)
	env.Apply(t, []string{agentNamespace}, objs)
	sa := "system:serviceaccount:" + agentNamespace + ":trustbridge-agent"

	tests := []struct {
		resource, subresource, verb, namespace string
		allowed                                bool
	}{
		{"pods", "", "get", "payments", true},
		{"pods", "", "list", "", true},
		{"pods", "", "watch", "", true},
		{"pods", "", "create", "payments", false},
		{"pods", "", "update", "payments", false},
		{"pods", "", "patch", "payments", false},
		{"pods", "", "delete", "payments", false},
		{"pods", "exec", "create", "payments", false},
		{"pods", "status", "update", "payments", false},
		{"secrets", "", "get", "payments", false},
		{"secrets", "", "list", "", false},
		{"configmaps", "", "get", agentNamespace, false},
		{"serviceaccounts", "token", "create", "payments", false},
		{"nodes", "", "get", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.resource+"/"+tt.subresource+"/"+tt.verb, func(t *testing.T) {
			review, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authzv1.SubjectAccessReview{
				Spec: authzv1.SubjectAccessReviewSpec{
					User:   sa,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + agentNamespace, "system:authenticated"},
					ResourceAttributes: &authzv1.ResourceAttributes{
						Namespace: tt.namespace, Resource: tt.resource, Subresource: tt.subresource, Verb: tt.verb,
					},
				},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.Equal(t, tt.allowed, review.Status.Allowed, "%s %s/%s: %s", tt.verb, tt.resource, tt.subresource, review.Status.Reason)
		})
	}
}

// injectedPod is a pod as Istio's sidecar template leaves it, before the
// templates of agent/istio-injection.yaml: istio-proxy mounts the
// emptyDir workload-socket (Istio CNI, so no init container), and
// everything passes the restricted level.
func injectedPod(ns string) map[string]any {
	restricted := map[string]any{
		"allowPrivilegeEscalation": false, "runAsNonRoot": true, "capabilities": map[string]any{"drop": []any{"ALL"}},
		"seccompProfile": map[string]any{"type": "RuntimeDefault"},
	}
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "web", "namespace": ns},
		"spec": map[string]any{
			"containers": []any{
				map[string]any{"name": "web", "image": "registry.example/web:1", "securityContext": restricted},
				map[string]any{
					"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.28.0", "securityContext": restricted,
					"volumeMounts": []any{map[string]any{"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"}},
				},
			},
			"volumes": []any{map[string]any{"name": "workload-socket", "emptyDir": map[string]any{}}},
		},
	}
}

// inject merges an injection template into pod as istiod does (a strategic
// merge patch of the template, read as YAML, onto the pod).
func inject(t *testing.T, pod map[string]any, template string) map[string]any {
	t.Helper()
	var patch map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(template), &patch))
	schema, err := strategicpatch.NewPatchMetaFromStruct(corev1.Pod{})
	require.NoError(t, err)
	out, err := strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(pod, patch, schema)
	require.NoError(t, err)
	return out
}

// Each template of agent/istio-injection.yaml gives istio-proxy the
// agent's socket directory, read only, at the path Istio's agent looks
// in, replacing the emptyDir of Istio's own template; the pods it makes
// pass the API server: the CSI one in a restricted namespace, the hostPath
// one only where hostPath volumes are admitted.
func TestIstioInjectionTemplates(t *testing.T) {
	data, err := os.ReadFile("agent/istio-injection.yaml")
	require.NoError(t, err)
	var values struct {
		SidecarInjectorWebhook struct {
			Templates map[string]string `json:"templates"`
		} `json:"sidecarInjectorWebhook"`
	}
	require.NoError(t, yaml.UnmarshalStrict(data, &values))
	templates := values.SidecarInjectorWebhook.Templates
	require.Len(t, templates, 2)

	env := kubetest.Shared(t)
	k := env.Kubectl(t)
	restricted, privileged := env.Namespace(t), env.Namespace(t)
	k.Must(nil, "label", "namespace", restricted, "pod-security.kubernetes.io/enforce=restricted")
	k.Must(nil, "label", "namespace", privileged, "pod-security.kubernetes.io/enforce=privileged")

	for name, want := range map[string]map[string]any{
		"trustbridge-csi":      {"csi": map[string]any{"driver": "csi.spiffe.io", "readOnly": true}},
		"trustbridge-hostpath": {"hostPath": map[string]any{"path": "/run/trustbridge/sockets", "type": "Directory"}},
	} {
		t.Run(name, func(t *testing.T) {
			require.Contains(t, templates, name)
			for _, ns := range []string{restricted, privileged} {
				pod := inject(t, injectedPod(ns), templates[name])
				vols, _, _ := unstructured.NestedSlice(pod, "spec", "volumes")
				want["name"] = "workload-socket"
				assert.Equal(t, []any{want}, vols, "one source: the emptyDir is gone")
				containers, _, _ := unstructured.NestedSlice(pod, "spec", "containers")
				require.Len(t, containers, 2)
				assert.Equal(t, []any{map[string]any{"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds", "readOnly": true}},
					containers[1].(map[string]any)["volumeMounts"])

				manifest, err := json.Marshal(pod)
				require.NoError(t, err)
				out, err := k.Run(manifest, "apply", "--dry-run=server", "-f", "-")
				if name == "trustbridge-hostpath" && ns == restricted {
					require.Error(t, err, "the restricted level refuses a hostPath: %s", out)
					assert.Contains(t, out, `restricted volume type "hostPath"`)
					continue
				}
				require.NoError(t, err, "%s in %s: %s", name, ns, out)
				assert.Contains(t, out, "(server dry run)")
			}
		})
	}

	// Without "emptyDir: null" the merge keeps both sources, which the
	// API server refuses: the test above is not vacuous.
	var lines []string
	for _, line := range strings.Split(templates["trustbridge-csi"], "\n") {
		if strings.TrimSpace(line) != "emptyDir: null" {
			lines = append(lines, line)
		}
	}
	bad := strings.Join(lines, "\n")
	require.NotEqual(t, templates["trustbridge-csi"], bad)
	manifest, err := json.Marshal(inject(t, injectedPod(restricted), bad))
	require.NoError(t, err)
	out, err := k.Run(manifest, "apply", "--dry-run=server", "-f", "-")
	require.Error(t, err)
	assert.Contains(t, out, "may not specify more than 1 volume type")
}
