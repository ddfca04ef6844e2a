package helmtest

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// signerRootPEM mints a CSR signer's root (a testRoot), PEM.
func signerRootPEM(t *testing.T) string {
	t.Helper()
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: testRoot(t, "corp.example CSR signer root").Raw}))
}

// upstreamKubeCSR is testdata/upstream-kube-csr.yaml with a signer root
// in place.
func upstreamKubeCSR(t *testing.T, roots string) map[string]any {
	t.Helper()
	v := valuesFile(t, "upstream-kube-csr.yaml")
	v["upstream"].(map[string]any)["kubeCSR"].(map[string]any)["roots"] = roots
	return v
}

// csrRules are the ClusterRoles' rules on certificatesigningrequests.
func csrRules(objs []*unstructured.Unstructured) []any {
	var out []any
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		out = append(out, csrRulesOf(rules)...)
	}
	return out
}

func csrRulesOf(rules []any) []any {
	var out []any
	for _, r := range rules {
		for _, res := range r.(map[string]any)["resources"].([]any) {
			if res == "certificatesigningrequests" {
				out = append(out, r)
			}
		}
	}
	return out
}

// upstream.kubeCSR.enabled runs the server with --upstream kube-csr: the
// flags, the signer's roots in the config ConfigMap (mounted at
// /etc/trustbridge), and the one ClusterRole rule it needs, which no other
// rendering grants.
func TestUpstreamKubeCSR(t *testing.T) {
	roots := signerRootPEM(t)
	objs := mustRender(t, upstreamKubeCSR(t, roots))
	_, cfg := serverConfig(t, objs, "trustbridge")
	assert.Equal(t, "kube-csr", cfg["upstream"])
	assert.Equal(t, "example.com/trustbridge-intermediate", cfg["upstream-signer-name"])
	assert.Equal(t, "/etc/trustbridge/upstream-roots.pem", cfg["upstream-kube-roots"])
	assert.Equal(t, "10m", cfg["upstream-csr-timeout"])
	assert.Equal(t, "24h", cfg["upstream-ttl"])
	got, _, _ := unstructured.NestedString(find(t, objs, "ConfigMap", "trustbridge-config").Object, "data", "upstream-roots.pem")
	assert.Equal(t, strings.TrimSpace(roots), strings.TrimSpace(got))
	block, _ := pem.Decode([]byte(got))
	require.NotNil(t, block, "the mounted roots are PEM")
	_, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.Equal(t, []any{map[string]any{
		"apiGroups": []any{"certificates.k8s.io"}, "resources": []any{"certificatesigningrequests"},
		"verbs": []any{"create", "get", "watch", "delete"},
	}}, csrRules(objs), "create, get, watch, delete: never approve or sign")

	for name, values := range map[string]map[string]any{"base": baseValues(), "full-kube": fullKube(t), "full-file": valuesFile(t, "full-file.yaml")} {
		assert.Empty(t, csrRules(mustRender(t, values)), "%s: no CSR access without upstream.kubeCSR", name)
	}
}
