package helmtest

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// helm template without --kube-version checks the chart against Helm's
// built-in capabilities: Kubernetes v1.20.0 in a helm built without the
// ldflags of Helm's own Makefile (go install, and these tests). The chart
// used to require kubeVersion >=1.30.0-0 and failed there; it renders now,
// admission policy included.
func TestHelmTemplateWithDefaultKubeVersion(t *testing.T) {
	caps := chartutil.DefaultCapabilities.Copy()
	require.Equal(t, "v1.20.0", caps.KubeVersion.Version, "the default the chart README describes")
	out, err := renderRelease(t, "trustbridge", caps, baseValues())
	require.NoError(t, err)
	assert.Contains(t, kinds(kubetest.DecodeObjects(t, out)), "ValidatingAdmissionPolicy")
}

// A cluster's discovery lists kinds; one serving admissionregistration.k8s.io/v1
// without ValidatingAdmissionPolicy (Kubernetes before 1.30) is refused
// with the reason, unless nothing needs the policy (file storage).
func TestClusterWithoutAdmissionPolicyRefused(t *testing.T) {
	old := chartutil.DefaultCapabilities.Copy()
	old.KubeVersion = chartutil.KubeVersion{Version: "v1.29.4", Major: "1", Minor: "29"}
	old.APIVersions = append(chartutil.VersionSet{"admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration"}, old.APIVersions...)
	_, err := renderRelease(t, "trustbridge", old, baseValues())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "this cluster does not serve admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy (Kubernetes v1.29.4; 1.30 or later has it)")

	_, err = renderRelease(t, "trustbridge", old, valuesFile(t, "full-file.yaml"))
	assert.NoError(t, err, "file storage writes no ConfigMap outside its namespace and needs no policy")

	current := old.Copy()
	current.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "35"}
	current.APIVersions = append(chartutil.VersionSet{"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"}, old.APIVersions...)
	_, err = renderRelease(t, "trustbridge", current, baseValues())
	assert.NoError(t, err)
}

var dnsLabel = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)

// Names come from the release as in Helm's scaffold (nameOverride,
// fullnameOverride, 63 characters at most), every object follows, and
// suffixed names keep their suffix within 63 characters.
func TestReleaseNames(t *testing.T) {
	long := strings.Repeat("a", 53) // Helm's longest release name
	cases := []struct {
		release  string
		override map[string]any
		want     string
	}{
		{"trustbridge", nil, "trustbridge"},
		{"east", nil, "east-trustbridge"},
		{"trustbridge-east", nil, "trustbridge-east"},
		{"east", map[string]any{"nameOverride": "ca"}, "east-ca"},
		{"east", map[string]any{"fullnameOverride": "pki"}, "pki"},
		{long, nil, (long + "-trustbridge")[:63]},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			values := agentValues(true)
			for k, v := range tc.override {
				values[k] = v
			}
			caps := chartutil.DefaultCapabilities.Copy()
			out, err := renderRelease(t, tc.release, caps, values)
			require.NoError(t, err)
			objs := kubetest.DecodeObjects(t, out)
			assertReleaseNames(t, objs, tc.want)
		})
	}
}

func assertReleaseNames(t *testing.T, objs []*unstructured.Unstructured, want string) {
	t.Helper()
	dep := find(t, objs, "Deployment", want)
	sel, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "selector", "matchLabels")
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": want}, sel)
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	assert.Equal(t, want, sa)
	find(t, objs, "Service", want)
	find(t, objs, "ServiceAccount", want)
	for _, o := range objs {
		name := o.GetName()
		assert.LessOrEqual(t, len(name), 63, "%s %s", o.GetKind(), name)
		if o.GetKind() == "Service" {
			assert.Regexp(t, dnsLabel, name)
		}
		if o.GetKind() == "RoleBinding" || o.GetKind() == "ClusterRoleBinding" {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			if s := subjects[0].(map[string]any); s["namespace"] == namespace {
				assert.Equal(t, want, s["name"], "%s %s binds the server's account", o.GetKind(), name)
			}
		}
	}
	cut := func(suffix string) string {
		return strings.TrimSuffix(want[:min(len(want), 62-len(suffix))], "-") + "-" + suffix
	}
	for kind, suffix := range map[string]string{"Service": "bundle", "ConfigMap": "config", "ValidatingAdmissionPolicy": "configmap-create",
		"DaemonSet": "agent", "ServiceAccount": "csi-driver"} {
		find(t, objs, kind, cut(suffix))
	}
	vap := find(t, objs, "ValidatingAdmissionPolicy", cut("configmap-create"))
	cond, _, _ := unstructured.NestedSlice(vap.Object, "spec", "matchConditions")
	assert.Contains(t, cond[0].(map[string]any)["expression"], `"system:serviceaccount:`+namespace+`:`+want+`"`)

	_, cfg := serverConfigIn(t, objs, cut("config"))
	assert.Equal(t, want+"."+namespace+".svc", cfg["grpc-dns-names"].([]any)[0])
	assert.Contains(t, cfg["ca-trusted-node-accounts"], "trustbridge-agent/"+cut("agent"), "the server trusts the agent's account")
	agent := find(t, objs, "DaemonSet", cut("agent"))
	agentSA, _, _ := unstructured.NestedString(agent.Object, "spec", "template", "spec", "serviceAccountName")
	assert.Equal(t, cut("agent"), agentSA)
	cs, _, _ := unstructured.NestedSlice(agent.Object, "spec", "template", "spec", "containers")
	assert.Contains(t, cs[0].(map[string]any)["args"], "--ca-addr="+want+"."+namespace+".svc:15012")
}

// serverConfigIn is serverConfig by the ConfigMap's full name.
func serverConfigIn(t *testing.T, objs []*unstructured.Unstructured, configMap string) (string, map[string]any) {
	t.Helper()
	return serverConfig(t, objs, strings.TrimSuffix(configMap, "-config"))
}

// platform.yaml: OpenShift's pod security, an HSM's volume, mount and
// environment, workload identity, the certificate service for VMs, the
// admin port for OpenShift's monitoring, egress narrowed.
func TestPlatformValues(t *testing.T) {
	objs := mustRender(t, valuesFile(t, "platform.yaml"))
	const name = "trustbridge-tbca"
	dep := find(t, objs, "Deployment", name)
	pod, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	assert.Equal(t, map[string]any{"runAsNonRoot": true, "seccompProfile": map[string]any{"type": "RuntimeDefault"}}, pod["securityContext"],
		"no uid, gid or fsGroup: the SCC assigns them")
	c := pod["containers"].([]any)[0].(map[string]any)
	assert.Equal(t, map[string]any{"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": map[string]any{"drop": []any{"ALL"}}},
		c["securityContext"])
	env := c["env"].([]any)
	require.Len(t, env, 2)
	assert.Equal(t, "POD_NAMESPACE", env[0].(map[string]any)["name"], "the chart's own variable stays")
	assert.Equal(t, map[string]any{"name": "CHRYSTOKI_CONF_DIR", "value": "/etc/hsm"}, env[1])
	assert.Contains(t, c["volumeMounts"], map[string]any{"name": "hsm", "mountPath": "/etc/hsm", "readOnly": true})
	assert.Contains(t, c["volumeMounts"], map[string]any{"name": "config", "mountPath": "/etc/trustbridge", "readOnly": true})
	assert.Contains(t, pod["volumes"], map[string]any{"name": "hsm", "secret": map[string]any{"secretName": "hsm-client", "defaultMode": float64(0o400)}})

	assert.Equal(t, map[string]string{"iam.gke.io/gcp-service-account": "trustbridge@east.iam.gserviceaccount.com"},
		find(t, objs, "ServiceAccount", name).GetAnnotations())
	grpc := find(t, objs, "Service", name)
	svcType, _, _ := unstructured.NestedString(grpc.Object, "spec", "type")
	assert.Equal(t, "NodePort", svcType)
	assert.Equal(t, map[string]string{"example.com/exposed-to": "vms"}, grpc.GetAnnotations())
	_, found, _ := unstructured.NestedString(find(t, objs, "Service", name+"-bundle").Object, "spec", "type")
	assert.False(t, found, "the bundle Service keeps its own type")

	np := find(t, objs, "NetworkPolicy", name)
	from, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	assert.Equal(t, map[string]any{
		"from": []any{map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "openshift-user-workload-monitoring"}},
			"podSelector":       map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "prometheus"}},
		}},
		"ports": []any{map[string]any{"port": float64(15014)}},
	}, from[1])
	egress, _, _ := unstructured.NestedSlice(np.Object, "spec", "egress")
	ipBlock := func(cidr string) []any { return []any{map[string]any{"ipBlock": map[string]any{"cidr": cidr}}} }
	assert.Equal(t, []any{
		map[string]any{"ports": []any{udp(53), tcp(53), udp(5353), tcp(5353)},
			"to": []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "openshift-dns"}}}}},
		map[string]any{"ports": []any{port(6443)}, "to": ipBlock("10.0.0.1/32")},
		map[string]any{"ports": []any{port(443)}, "to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "0.0.0.0/0", "except": []any{"10.0.0.0/8"}}}}},
		map[string]any{"ports": []any{port(15443)}, "to": ipBlock("10.20.0.5/32")},
		map[string]any{"ports": []any{tcp(1792)}, "to": ipBlock("10.30.0.0/24")},
	}, egress)
}

func port(n float64) map[string]any { return map[string]any{"port": n} }
func udp(n float64) map[string]any  { return map[string]any{"port": n, "protocol": "UDP"} }
func tcp(n float64) map[string]any  { return map[string]any{"port": n, "protocol": "TCP"} }

// Egress by default: DNS, the API server and bundle endpoints, to any
// address; the upstream's port only with --upstream trustbridge; none of
// it with networkPolicy.egress.enabled=false. The admin port by default
// only from the namespace monitoring.
func TestNetworkPolicyEgress(t *testing.T) {
	np := find(t, mustRender(t, baseValues()), "NetworkPolicy", "trustbridge")
	types, _, _ := unstructured.NestedStringSlice(np.Object, "spec", "policyTypes")
	assert.Equal(t, []string{"Ingress", "Egress"}, types)
	egress, _, _ := unstructured.NestedSlice(np.Object, "spec", "egress")
	defaults := []any{
		map[string]any{"ports": []any{udp(53), tcp(53)}},
		map[string]any{"ports": []any{port(443), port(6443)}},
		map[string]any{"ports": []any{port(443), port(8443)}},
	}
	assert.Equal(t, defaults, egress)
	ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	assert.Equal(t, []any{map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}},
		"podSelector":       map[string]any{},
	}}, ingress[1].(map[string]any)["from"])

	v := baseValues()
	v["extraConfig"] = map[string]any{"upstream": "trustbridge", "upstream-address": "ca.corp.example:15012"}
	egress, _, _ = unstructured.NestedSlice(find(t, mustRender(t, v), "NetworkPolicy", "trustbridge").Object, "spec", "egress")
	assert.Equal(t, append(defaults, map[string]any{"ports": []any{port(15012)}}), egress)

	v = baseValues()
	v["networkPolicy"] = map[string]any{"egress": map[string]any{"enabled": false}}
	np = find(t, mustRender(t, v), "NetworkPolicy", "trustbridge")
	types, _, _ = unstructured.NestedStringSlice(np.Object, "spec", "policyTypes")
	assert.Equal(t, []string{"Ingress"}, types)
	_, found, _ := unstructured.NestedSlice(np.Object, "spec", "egress")
	assert.False(t, found)

	// A rule without ports would open every port.
	for _, bad := range []map[string]any{{"ports": []any{}}, {"ports": []any{0}}, {"ports": []any{"https"}}, {"port": []any{443}}} {
		v = baseValues()
		v["networkPolicy"] = map[string]any{"egress": map[string]any{"apiServer": bad}}
		_, err := render(t, v)
		require.Error(t, err, "%v", bad)
		assert.Contains(t, err.Error(), "networkPolicy")
	}
}

// pods get, list and watch only while node proxies may ask for their
// pods' certificates: the server watches pods for nothing else.
func TestPodsRuleFollowsImpersonation(t *testing.T) {
	podsRule := func(values map[string]any) bool {
		rules, _, _ := unstructured.NestedSlice(find(t, mustRender(t, values), "ClusterRole", "trustbridge").Object, "rules")
		for _, r := range rules {
			for _, res := range r.(map[string]any)["resources"].([]any) {
				if res == "pods" {
					assert.Equal(t, []any{"get", "list", "watch"}, r.(map[string]any)["verbs"])
					return true
				}
			}
		}
		return false
	}
	with := func(accounts any) map[string]any {
		v := baseValues()
		v["policy"] = map[string]any{"caTrustedNodeAccounts": accounts}
		return v
	}
	assert.True(t, podsRule(baseValues()), "default: ztunnel and the agent")
	assert.True(t, podsRule(with([]any{"istio-system/ztunnel"})))
	assert.False(t, podsRule(with([]any{})), "[] refuses all impersonation")
	_, cfg := serverConfig(t, mustRender(t, with([]any{})), "trustbridge")
	assert.Equal(t, []any{}, cfg["ca-trusted-node-accounts"], "the server is told so")
}

// A file-storage pod keeps fsGroupChangePolicy OnRootMismatch whatever
// podSecurityContext says, unless it sets the field itself.
func TestFileStorageSecurityContext(t *testing.T) {
	v := valuesFile(t, "full-file.yaml")
	v["podSecurityContext"] = map[string]any{"runAsUser": nil, "runAsGroup": nil, "fsGroup": nil}
	sc, _, _ := unstructured.NestedMap(find(t, mustRender(t, v), "Deployment", "trustbridge").Object, "spec", "template", "spec", "securityContext")
	assert.Equal(t, map[string]any{"runAsNonRoot": true, "seccompProfile": map[string]any{"type": "RuntimeDefault"}, "fsGroupChangePolicy": "OnRootMismatch"}, sc)

	v["podSecurityContext"] = map[string]any{"fsGroupChangePolicy": "Always"}
	policy, _, _ := unstructured.NestedString(find(t, mustRender(t, v), "Deployment", "trustbridge").Object,
		"spec", "template", "spec", "securityContext", "fsGroupChangePolicy")
	assert.Equal(t, "Always", policy)
}

// The chart's PrometheusRule carries deploy/monitoring's rules, as the
// operator's file there does, and the labels that let Prometheus' rule
// selector pick it.
func TestPrometheusRule(t *testing.T) {
	pr := find(t, mustRender(t, fullKube(t)), "PrometheusRule", "tb")
	assert.Equal(t, "prometheus", pr.GetLabels()["release"])
	assert.Equal(t, "tb", pr.GetLabels()["app.kubernetes.io/name"])

	var plain map[string]any
	data, err := os.ReadFile("../../monitoring/alerts.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &plain))
	var operator struct {
		Spec map[string]any `json:"spec"`
	}
	data, err = os.ReadFile("../../monitoring/prometheusrule.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &operator))
	assert.Equal(t, plain, pr.Object["spec"], "the chart's files/alerts.yaml is deploy/monitoring/alerts.yaml")
	assert.Equal(t, operator.Spec, pr.Object["spec"])
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	assert.NotEmpty(t, groups)
}
