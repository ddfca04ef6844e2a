package helmtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// helm lint (Helm's own chart checks: Chart.yaml, values against the
// schema, templates that render to valid YAML with metadata Kubernetes
// accepts) finds nothing worse than information.
func TestHelmLint(t *testing.T) {
	for name, values := range map[string]map[string]any{"base": baseValues(), "full-kube": fullKube(t), "full-file": valuesFile(t, "full-file.yaml"),
		"agent": valuesFile(t, "agent.yaml"), "agent-default": agentValues(true),
		"platform": valuesFile(t, "platform.yaml"), "pod-identity": valuesFile(t, "pod-identity.yaml")} {
		t.Run(name, func(t *testing.T) {
			res := lint.AllWithKubeVersion(chartDir, values, namespace, nil)
			for _, m := range res.Messages {
				assert.Less(t, m.Severity, support.WarningSev, "%s", m)
				t.Log(m)
			}
		})
	}
}
