package helmtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// podIdentity is testdata/pod-identity.yaml with each feature on or off.
func podIdentity(t *testing.T, podCerts, bundles bool) map[string]any {
	t.Helper()
	v := valuesFile(t, "pod-identity.yaml")
	pi := v["podIdentity"].(map[string]any)
	pi["podCertificates"].(map[string]any)["enabled"] = podCerts
	if !podCerts {
		delete(pi["podCertificates"].(map[string]any), "namespaces")
	}
	pi["clusterTrustBundles"].(map[string]any)["enabled"] = bundles
	return v
}

// rbacManifest reads object index of file in deploy/rbac/pod-identity.
func rbacManifest(t *testing.T, file string, index int) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("../../rbac/pod-identity", file))
	require.NoError(t, err)
	objs := kubetest.DecodeObjects(t, string(data))
	require.Greater(t, len(objs), index, file)
	return objs[index].Object
}

func kindsNamed(objs []*unstructured.Unstructured, suffix string) []string {
	var k []string
	for _, o := range objs {
		if strings.HasSuffix(o.GetName(), suffix) {
			k = append(k, o.GetKind())
		}
	}
	return k
}

// With both features the chart's ClusterRole, binding and admission
// policy are deploy/rbac/pod-identity's, rule for rule and expression for
// expression (the same signer name), bound to the release's account, and
// the server's config names the signer for both flags.
func TestPodIdentityEqualsRBACManifests(t *testing.T) {
	objs := mustRender(t, podIdentity(t, true, true))
	_, cfg := serverConfig(t, objs, "trustbridge")
	assert.Equal(t, "trustbridge.io/svid", cfg["pod-certificate-signer"])
	assert.Equal(t, "kubernetes.io/metadata.name in (shop,pay)", cfg["pod-certificate-namespaces"])
	assert.Equal(t, "trustbridge.io/svid", cfg["cluster-trust-bundle-signer"])

	role := find(t, objs, "ClusterRole", "trustbridge-pod-identity")
	assert.Equal(t, rbacManifest(t, "clusterrole.yaml", 0)["rules"], role.Object["rules"])
	binding := find(t, objs, "ClusterRoleBinding", "trustbridge-pod-identity")
	assert.Equal(t, rbacManifest(t, "clusterrolebinding.yaml", 0)["roleRef"], binding.Object["roleRef"])
	assert.Equal(t, rbacManifest(t, "clusterrolebinding.yaml", 0)["subjects"], binding.Object["subjects"])
	vap := find(t, objs, "ValidatingAdmissionPolicy", "trustbridge-pod-certificate-requests")
	assert.Equal(t, rbacManifest(t, "admissionpolicy.yaml", 0)["spec"], vap.Object["spec"])
	vapb := find(t, objs, "ValidatingAdmissionPolicyBinding", "trustbridge-pod-certificate-requests")
	assert.Equal(t, rbacManifest(t, "admissionpolicy.yaml", 1)["spec"], vapb.Object["spec"])
}

// Each feature alone gets only its part: pod certificates the sign verb,
// the request rules and the admission policy; ClusterTrustBundles the
// attest verb and the bundle rules. The signer name is pinned wherever it
// appears, and nothing is rendered with both off.
func TestPodIdentityEachFeature(t *testing.T) {
	resources := func(role *unstructured.Unstructured) []any {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		var res []any
		for _, r := range rules {
			res = append(res, r.(map[string]any)["resources"].([]any)...)
		}
		return res
	}
	signerRule := func(role *unstructured.Unstructured) map[string]any {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		return rules[0].(map[string]any)
	}

	v := podIdentity(t, true, false)
	v["podIdentity"].(map[string]any)["signerName"] = "pki.example.com/pods"
	objs := mustRender(t, v)
	_, cfg := serverConfig(t, objs, "trustbridge")
	assert.Equal(t, "pki.example.com/pods", cfg["pod-certificate-signer"])
	assert.NotContains(t, cfg, "cluster-trust-bundle-signer")
	role := find(t, objs, "ClusterRole", "trustbridge-pod-identity")
	assert.Equal(t, []any{"pki.example.com/pods"}, signerRule(role)["resourceNames"])
	assert.Equal(t, []any{"sign"}, signerRule(role)["verbs"])
	assert.ElementsMatch(t, []any{"signers", "podcertificaterequests", "podcertificaterequests/status", "pods", "serviceaccounts", "namespaces", "nodes"}, resources(role))
	vap := find(t, objs, "ValidatingAdmissionPolicy", "trustbridge-pod-certificate-requests")
	cond, _, _ := unstructured.NestedSlice(vap.Object, "spec", "matchConditions")
	assert.Equal(t, `object.spec.signerName == "pki.example.com/pods"`, cond[0].(map[string]any)["expression"])
	val, _, _ := unstructured.NestedSlice(vap.Object, "spec", "validations")
	assert.Contains(t, val[0].(map[string]any)["message"], "may ask signer pki.example.com/pods for a pod certificate")
	find(t, objs, "ValidatingAdmissionPolicyBinding", "trustbridge-pod-certificate-requests")

	objs = mustRender(t, podIdentity(t, false, true))
	_, cfg = serverConfig(t, objs, "trustbridge")
	assert.Equal(t, "trustbridge.io/svid", cfg["cluster-trust-bundle-signer"])
	assert.NotContains(t, cfg, "pod-certificate-signer")
	assert.NotContains(t, cfg, "pod-certificate-namespaces")
	role = find(t, objs, "ClusterRole", "trustbridge-pod-identity")
	assert.Equal(t, []any{"attest"}, signerRule(role)["verbs"])
	assert.ElementsMatch(t, []any{"signers", "clustertrustbundles"}, resources(role))
	assert.Empty(t, kindsNamed(objs, "pod-certificate-requests"), "no admission policy without pod certificates")

	cases := map[string]struct {
		values  map[string]any
		release string
	}{
		"base": {baseValues(), "trustbridge"}, "full-kube": {fullKube(t), "tb"}, "full-file": {valuesFile(t, "full-file.yaml"), "trustbridge"},
	}
	for name, tc := range cases {
		objs := mustRender(t, tc.values)
		assert.Empty(t, kindsNamed(objs, "pod-identity"), "%s: no pod identity RBAC", name)
		assert.Empty(t, kindsNamed(objs, "pod-certificate-requests"), "%s: no pod certificate policy", name)
		for _, o := range objs {
			if o.GetKind() == "ClusterRole" {
				assert.NotContains(t, resources(o), "signers", "%s %s", name, o.GetName())
			}
		}
		_, cfg := serverConfig(t, objs, tc.release)
		for _, k := range []string{"pod-certificate-signer", "pod-certificate-namespaces", "cluster-trust-bundle-signer"} {
			assert.NotContains(t, cfg, k, name)
		}
	}
}

// notes renders NOTES.txt, which helm install prints.
func notes(t *testing.T, values map[string]any) string {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	require.NoError(t, err)
	opts := chartutil.ReleaseOptions{Name: "trustbridge", Namespace: namespace, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(chrt, values, opts, kubeCapabilities())
	require.NoError(t, err)
	files, err := engine.Render(chrt, vals)
	require.NoError(t, err)
	return files["trustbridge/templates/NOTES.txt"]
}

// After install, the notes give the volume sources a pod needs for the
// features enabled, with the signer name, and nothing of them otherwise.
func TestPodIdentityNotes(t *testing.T) {
	got := notes(t, podIdentity(t, true, false))
	assert.Contains(t, got, `pods of namespaces matching "kubernetes.io/metadata.name in (shop,pay)"`)
	assert.Contains(t, got, "{podCertificate: {signerName: trustbridge.io/svid, keyType: ECDSAP256, credentialBundlePath: svid.pem}}")
	assert.NotContains(t, got, "clusterTrustBundle:")

	got = notes(t, podIdentity(t, false, true))
	assert.Contains(t, got, "{clusterTrustBundle: {signerName: trustbridge.io/svid, labelSelector: {matchLabels: {trustbridge.io/trust-domain: east.example}}, path: bundle.pem}}")
	assert.NotContains(t, got, "podCertificate:")

	assert.NotContains(t, notes(t, baseValues()), "pod identity")
}
