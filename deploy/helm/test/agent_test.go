package helmtest

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

const (
	agentDir     = "../../agent"
	csiDriverDir = "../../agent/csi-driver"
)

// agentValues are baseValues with the node agent, and the CSI driver if
// csi.
func agentValues(csi bool) map[string]any {
	v := baseValues()
	v["agent"] = map[string]any{"enabled": true, "csiDriver": map[string]any{"enabled": csi}}
	return v
}

// renderKustomize renders the kustomizations dirs with the kubectl users
// run, as one list.
func renderKustomize(t *testing.T, dirs ...string) []*unstructured.Unstructured {
	t.Helper()
	k := kubetest.OfflineKubectl(t)
	var objs []*unstructured.Unstructured
	for _, dir := range dirs {
		objs = append(objs, kubetest.DecodeObjects(t, k.Must(nil, "kustomize", dir))...)
	}
	return objs
}

// assertSameObjects compares a rendering of the chart with kustomize's,
// as TestChartEqualsKustomizeBase does.
func assertSameObjects(t *testing.T, kustomized, chart []*unstructured.Unstructured) {
	t.Helper()
	want, got := map[objKey]*unstructured.Unstructured{}, map[objKey]*unstructured.Unstructured{}
	for _, o := range kustomized {
		want[normalizeKey(keyOf(o))] = o
	}
	for _, o := range chart {
		got[normalizeKey(keyOf(o))] = o
	}
	keys := func(m map[objKey]*unstructured.Unstructured) []string {
		var s []string
		for k := range m {
			s = append(s, k.String())
		}
		sort.Strings(s)
		return s
	}
	require.Equal(t, keys(want), keys(got), "the same objects")
	for k, w := range want {
		assert.Equal(t, normalize(t, w).Object, normalize(t, got[k]).Object, k.String())
	}
}

// With agent.enabled the chart is deploy/base and deploy/agent; with
// agent.csiDriver.enabled too, also deploy/agent/csi-driver: field for
// field, so that neither drifts from the other.
func TestChartAgentEqualsKustomize(t *testing.T) {
	t.Run("agent", func(t *testing.T) {
		assertSameObjects(t, renderKustomize(t, baseDir, agentDir), mustRender(t, agentValues(false)))
	})
	t.Run("agent and CSI driver", func(t *testing.T) {
		assertSameObjects(t, renderKustomize(t, baseDir, agentDir, csiDriverDir), mustRender(t, agentValues(true)))
	})
}

// The server trusts the agent's service account by default (as
// deploy/base does), whatever the agent's namespace and name; an explicit
// list must name it when the agent is on.
func TestAgentTrustedByServer(t *testing.T) {
	_, cfg := serverConfig(t, mustRender(t, baseValues()), "trustbridge")
	assert.Equal(t, []any{"istio-system/ztunnel", "trustbridge-agent/trustbridge-agent"}, cfg["ca-trusted-node-accounts"])

	v := agentValues(false)
	v["fullnameOverride"] = "tb"
	v["agent"].(map[string]any)["namespace"] = map[string]any{"name": "node-agents"}
	_, cfg = serverConfig(t, mustRender(t, v), "tb")
	assert.Equal(t, []any{"istio-system/ztunnel", "node-agents/tb-agent"}, cfg["ca-trusted-node-accounts"])

	v["policy"] = map[string]any{"caTrustedNodeAccounts": []any{"istio-system/ztunnel"}}
	_, err := render(t, v)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "policy.caTrustedNodeAccounts does not list node-agents/tb-agent")
}

// Every agent value lands where values.yaml says, and the agent follows
// the server's names: its address, its roots' ConfigMap, its token
// audience.
func TestAgentValues(t *testing.T) {
	objs := mustRender(t, valuesFile(t, "agent.yaml"))
	ds := find(t, objs, "DaemonSet", "tb-agent")
	assert.Equal(t, "node-agents", ds.GetNamespace())
	pod, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	c := pod["containers"].([]any)[0].(map[string]any)
	assert.Equal(t, "registry.example/trustbridge:v9.9.9", c["image"])
	assert.Equal(t, []any{
		"agent", "--node", "--ca-addr=tb.trustbridge-system.svc:15012",
		"--root-cert=/var/run/secrets/trustbridge/root-cert.pem", "--token-file=/var/run/secrets/tokens/trustbridge",
		"--sds-socket=/run/tb/sockets/socket", "--admin-listen=0.0.0.0:15022", "--log-format=json", "--log-level=debug",
		"--identity-map=/etc/trustbridge/identity-map/identity-map.yaml", "--identity-map-crd", "--identity-default=none", "--attest-binary",
		"--max-identities=200", "--ttl=6h",
		"--broker-socket=/run/tb/broker/broker.sock", "--broker-socket-group=1337",
		"--broker-allow=sa:istio-system/ztunnel", "--broker-allow=uid:0",
	}, c["args"])
	add, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "add")
	assert.Equal(t, []string{"SYS_PTRACE"}, add, "--attest-binary reads other users' /proc/<pid>/exe")
	assert.Equal(t, "system-node-critical", pod["priorityClassName"])
	assert.Equal(t, map[string]any{"kubernetes.io/os": "linux"}, pod["nodeSelector"])
	assert.Equal(t, []any{map[string]any{"operator": "Exists"}}, pod["tolerations"])
	assert.Equal(t, []any{map[string]any{"name": "registry-credentials"}}, pod["imagePullSecrets"])
	ann, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "annotations")
	assert.Equal(t, map[string]string{"example.com/team": "security"}, ann)
	mem, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
	assert.Equal(t, "512Mi", mem)

	vols := map[string]map[string]any{}
	list, _, _ := unstructured.NestedSlice(pod, "volumes")
	for _, v := range list {
		v := v.(map[string]any)
		vols[v["name"].(string)] = v
	}
	assert.Equal(t, map[string]any{"path": "/run/tb/sockets", "type": "DirectoryOrCreate"}, vols["sockets"]["hostPath"])
	assert.Equal(t, map[string]any{"path": "/run/tb/broker", "type": "DirectoryOrCreate"}, vols["broker"]["hostPath"],
		"the broker socket in a directory of its own, apart from the one every pod may mount")
	agentMounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	assert.Contains(t, agentMounts, map[string]any{"name": "broker", "mountPath": "/run/tb/broker"})
	aud, _, _ := unstructured.NestedSlice(vols["token"], "projected", "sources")
	assert.Equal(t, "east.example-ca", aud[0].(map[string]any)["serviceAccountToken"].(map[string]any)["audience"], "the server's token-audience")
	cm, _, _ := unstructured.NestedString(vols["root-cert"], "configMap", "name")
	assert.Equal(t, "trustbridge-ca-root-cert", cm)

	// The identity map reaches the agent as the value, templates untouched.
	raw, _, _ := unstructured.NestedString(find(t, objs, "ConfigMap", "tb-agent-identity-map").Object, "data", "identity-map.yaml")
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(raw), &doc))
	assert.Equal(t, valuesFile(t, "agent.yaml")["agent"].(map[string]any)["identityMap"], doc)
	assert.Contains(t, raw, "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/sa/{{.ServiceAccount}}")

	// The namespace is the operator's (create: false).
	for _, o := range objs {
		assert.NotEqual(t, "Namespace", o.GetKind(), "namespace.create is false in agent.yaml: %s", o.GetName())
	}

	csi := find(t, objs, "DaemonSet", "tb-csi-driver")
	containers, _, _ := unstructured.NestedSlice(csi.Object, "spec", "template", "spec", "containers")
	driver, registrar := containers[0].(map[string]any), containers[1].(map[string]any)
	assert.Equal(t, "registry.example/spiffe-csi-driver:0.2.99", driver["image"])
	assert.Equal(t, "registry.example/csi-node-driver-registrar:v2.99.0", registrar["image"])
	assert.Contains(t, registrar["args"], "-kubelet-registration-path=/var/lib/k0s/kubelet/plugins/csi.spiffe.io/csi.sock")
	mounts, _, _ := unstructured.NestedSlice(driver, "volumeMounts")
	assert.Contains(t, mounts, map[string]any{"name": "kubelet-pods", "mountPath": "/var/lib/k0s/kubelet/pods", "mountPropagation": "Bidirectional"})
	csiPod, _, _ := unstructured.NestedMap(csi.Object, "spec", "template", "spec")
	assert.Equal(t, pod["tolerations"], csiPod["tolerations"], "the driver runs wherever the agent does")
	assert.Equal(t, pod["nodeSelector"], csiPod["nodeSelector"])
}

// The agent needs the roots kube storage distributes, and the CSI driver
// needs the agent: refused at render time, naming the value.
func TestAgentBadValues(t *testing.T) {
	file := valuesFile(t, "full-file.yaml")
	file["agent"] = map[string]any{"enabled": true}
	_, err := render(t, file)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "agent.enabled needs storage.type=kube")

	csiOnly := baseValues()
	csiOnly["agent"] = map[string]any{"csiDriver": map[string]any{"enabled": true}}
	_, err = render(t, csiOnly)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "agent.csiDriver.enabled needs agent.enabled")

	bad := agentValues(false)
	bad["agent"].(map[string]any)["identityDefault"] = "spire"
	_, err = render(t, bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "identityDefault")

	// Brokers: only with the agent, only named ones, never on the socket
	// directory every pod may mount.
	for name, c := range map[string]struct {
		agent map[string]any
		want  string
	}{
		"without the agent": {map[string]any{"broker": map[string]any{"enabled": true, "allow": []any{"uid:0"}}}, "agent.broker.enabled needs agent.enabled"},
		"no rule":           {map[string]any{"enabled": true, "broker": map[string]any{"enabled": true}}, "agent.broker.enabled needs agent.broker.allow"},
		"bad rule":          {map[string]any{"enabled": true, "broker": map[string]any{"enabled": true, "allow": []any{"ztunnel"}}}, "allow"},
		"shared directory": {map[string]any{"enabled": true, "broker": map[string]any{"enabled": true, "allow": []any{"uid:0"}, "socketDir": "/run/trustbridge/sockets"}},
			"agent.broker.socketDir must be neither agent.socketDir nor inside or above it"},
		"inside the shared directory": {map[string]any{"enabled": true, "broker": map[string]any{"enabled": true, "allow": []any{"uid:0"}, "socketDir": "/run/trustbridge/sockets/broker"}},
			"agent.broker.socketDir must be neither agent.socketDir nor inside or above it"},
		"the shared directory, spelt otherwise": {map[string]any{"enabled": true, "broker": map[string]any{"enabled": true, "allow": []any{"uid:0"}, "socketDir": "/run//trustbridge/sockets"}},
			"agent.broker.socketDir must be neither agent.socketDir nor inside or above it"},
		"above the shared directory": {map[string]any{"enabled": true, "broker": map[string]any{"enabled": true, "allow": []any{"uid:0"}, "socketDir": "/run/trustbridge"}},
			"agent.broker.socketDir must be neither agent.socketDir nor inside or above it"},
	} {
		t.Run(name, func(t *testing.T) {
			v := baseValues()
			v["agent"] = c.agent
			_, err := render(t, v)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// Least privilege: the agent's only rule reads pods; nothing of the
// agent's reads Secrets or writes anything.
func TestAgentRBAC(t *testing.T) {
	objs := mustRender(t, agentValues(true))
	cr := find(t, objs, "ClusterRole", "trustbridge-agent")
	rules, _, _ := unstructured.NestedSlice(cr.Object, "rules")
	// Pods and the identity map resources, read only: the agent writes
	// nothing, not even their status (the server does).
	assert.Equal(t, []any{
		map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get", "list", "watch"}},
		map[string]any{"apiGroups": []any{"trustbridge.dev"}, "resources": []any{"clusteridentitymappings"}, "verbs": []any{"get", "list", "watch"}},
	}, rules)
	var agentKinds []string
	for _, o := range objs {
		if o.GetNamespace() == "trustbridge-agent" {
			agentKinds = append(agentKinds, o.GetKind())
		}
	}
	assert.NotContains(t, agentKinds, "Role", "no namespaced grants in the agent's namespace")
	assert.NotContains(t, agentKinds, "RoleBinding")
}

// The agents' identity map is the server's too: it grants a node agent
// only the IDs the map gives a pod on its node, so both must hold the
// same rules and default.
func TestAgentIdentityMapReachesServer(t *testing.T) {
	values := valuesFile(t, "agent.yaml")
	objs := mustRender(t, values)
	_, cfg := serverConfig(t, objs, "tb")
	assert.Equal(t, "/etc/trustbridge/identity-map.yaml", cfg["identity-map"])
	assert.Equal(t, "none", cfg["identity-map-default"])
	serverMap, _, err := unstructured.NestedString(find(t, objs, "ConfigMap", "tb-config").Object, "data", "identity-map.yaml")
	require.NoError(t, err)
	agentMap, _, err := unstructured.NestedString(find(t, objs, "ConfigMap", "tb-agent-identity-map").Object, "data", "identity-map.yaml")
	require.NoError(t, err)
	assert.NotEmpty(t, serverMap)
	assert.Equal(t, agentMap, serverMap)

	// Without agent rules the server has no map file (the resources, if
	// any, are its map).
	_, cfg = serverConfig(t, mustRender(t, agentValues(true)), "trustbridge")
	assert.NotContains(t, cfg, "identity-map")
	assert.NotContains(t, cfg, "identity-map-default")
}
