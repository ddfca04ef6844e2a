package helmtest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// Every rendering passes `kubectl apply --dry-run=server` against a real
// API server: its validation (schemas, the CRDs' OpenAPI and CEL rules,
// strict field validation, admission) accepts every object, as it does for
// the kustomize overlays (deploy/deploy_test.go).
func TestApplyDryRunServer(t *testing.T) {
	k := kubetest.Shared(t).Kubectl(t)
	// Server dry run of custom resources and namespaced objects needs the
	// CRDs and the namespace to exist: Helm installs crds first too.
	crd, err := yaml.Marshal(find(t, mustRender(t, baseValues()), "CustomResourceDefinition", "clusterfederatedtrustdomains.trustbridge.dev").Object)
	require.NoError(t, err)
	k.Must(crd, "apply", "-f", "-")
	k.Must(nil, "apply", "-f", "testdata/servicemonitor-crd.yaml", "-f", "testdata/prometheusrule-crd.yaml")
	k.Must(nil, "wait", "--for", "condition=established", "--timeout", "60s",
		"crd/clusterfederatedtrustdomains.trustbridge.dev", "crd/servicemonitors.monitoring.coreos.com",
		"crd/prometheusrules.monitoring.coreos.com")
	k.Must([]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+namespace+"\n"), "apply", "-f", "-")
	// The agent's namespaces: the one agent.yaml names without creating
	// it, and the default, which the chart renders but a dry run does not
	// create. Privileged, as the chart's own.
	for _, ns := range []string{"node-agents", "trustbridge-agent"} {
		k.Must([]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+ns+"\n  labels:\n    pod-security.kubernetes.io/enforce: privileged\n"), "apply", "-f", "-")
	}

	cases := map[string]map[string]any{
		"base":              baseValues(),
		"defaults":          {"trustDomain": "example.org"},
		"full-kube":         fullKube(t),
		"full-file":         valuesFile(t, "full-file.yaml"),
		"file-claim":        valuesFile(t, "file-claim.yaml"),
		"upstream-kube-csr": upstreamKubeCSR(t, signerRootPEM(t)),
		"agent":             valuesFile(t, "agent.yaml"),
		"agent-default":     agentValues(true),
		"platform":          valuesFile(t, "platform.yaml"),
		"pod-identity":      valuesFile(t, "pod-identity.yaml"),
	}
	for name, values := range cases {
		t.Run(name, func(t *testing.T) {
			rendered, err := render(t, values)
			require.NoError(t, err)
			objs := kubetest.DecodeObjects(t, rendered)
			require.NotEmpty(t, objs)
			out := k.Must([]byte(rendered), "apply", "--dry-run=server", "-f", "-")
			assert.Equal(t, len(objs), strings.Count(out, "(server dry run)"), "every object passes: %s", out)
		})
	}

	// The dry run is not vacuous: a misspelt ServiceMonitor field is
	// refused by the cut-down CRD's schema.
	rendered, err := render(t, fullKube(t))
	require.NoError(t, err)
	bad := strings.Replace(rendered, "scrapeTimeout:", "scrapeTimeOut:", 1)
	require.NotEqual(t, rendered, bad)
	out, err := k.Run([]byte(bad), "apply", "--dry-run=server", "-f", "-")
	require.Error(t, err)
	assert.Contains(t, out, "scrapeTimeOut")
}
