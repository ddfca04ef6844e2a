package helmtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// Umbrella charts pass `global` to every subchart (Helm copies the
// parent's globals into the subchart's values before checking them
// against its schema), so the root's additionalProperties: false must
// still let `global` through.
func TestGlobalValuesAccepted(t *testing.T) {
	globals := map[string]any{"imageRegistry": "registry.example", "storageClass": "fast"}

	t.Run("set directly", func(t *testing.T) {
		v := baseValues()
		v["global"] = globals
		mustRender(t, v)
	})

	t.Run("as a subchart of an umbrella chart", func(t *testing.T) {
		sub, err := loader.Load(chartDir)
		require.NoError(t, err)
		parent := &chart.Chart{Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "umbrella", Version: "0.1.0"}}
		parent.AddDependency(sub)
		values := map[string]any{"global": globals, sub.Name(): baseValues()}
		caps := chartutil.DefaultCapabilities.Copy()
		caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "35"}
		opts := chartutil.ReleaseOptions{Name: "umbrella", Namespace: namespace, Revision: 1, IsInstall: true}
		vals, err := chartutil.ToRenderValues(parent, values, opts, caps)
		require.NoError(t, err, "the schema refuses the umbrella's globals")
		files, err := engine.Render(parent, vals)
		require.NoError(t, err)
		assert.NotEmpty(t, files["umbrella/charts/trustbridge/templates/deployment.yaml"])
	})

	t.Run("not an object", func(t *testing.T) {
		v := baseValues()
		v["global"] = "x"
		_, err := render(t, v)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "global")
	})
}
