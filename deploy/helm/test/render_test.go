package helmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

const (
	chartDir = "../trustbridge"
	baseDir  = "../../base"
	// The namespace deploy/base installs into, and the chart's release
	// namespace in these tests.
	namespace = "trustbridge-system"
)

// kubeVersion is the API server tier's (internal/testkit/kubetest/tools pins
// k8s.io/kubernetes v1.35.4): the chart's kubeVersion must admit it.
const kubeVersion = "v1.35.4"

// render runs what `helm template --namespace trustbridge-system` runs:
// load the chart, coalesce values with values.yaml and check them against
// values.schema.json, then execute the templates. It returns every
// manifest, NOTES.txt aside, in a stable order.
func render(t *testing.T, values map[string]any) (string, error) {
	t.Helper()
	return renderRelease(t, "trustbridge", kubeCapabilities(), values)
}

// kubeCapabilities are Helm's defaults with the API server tier's version.
func kubeCapabilities() *chartutil.Capabilities {
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "35"}
	return caps
}

// renderRelease renders the chart as release name against a cluster of
// caps, after the check of the chart's kubeVersion that helm install and
// helm template make first (helm.sh/helm/v3/pkg/action.Install).
func renderRelease(t *testing.T, name string, caps *chartutil.Capabilities, values map[string]any) (string, error) {
	t.Helper()
	return renderIn(t, name, namespace, caps, values)
}

// renderIn is renderRelease into namespace ns.
func renderIn(t *testing.T, name, ns string, caps *chartutil.Capabilities, values map[string]any) (string, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	require.NoError(t, err)
	if chrt.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", chrt.Metadata.KubeVersion, caps.KubeVersion.String())
	}
	opts := chartutil.ReleaseOptions{Name: name, Namespace: ns, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(chrt, values, opts, caps)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(chrt, vals)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.HasSuffix(name, ".yaml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		if strings.TrimSpace(files[name]) != "" {
			b.WriteString("---\n# Source: " + name + "\n" + files[name] + "\n")
		}
	}
	return b.String(), nil
}

func mustRender(t *testing.T, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	out, err := render(t, values)
	require.NoError(t, err)
	return kubetest.DecodeObjects(t, out)
}

// valuesFile reads testdata/name.
func valuesFile(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, yaml.Unmarshal(data, &v))
	return v
}

// baseValues are the values that make the chart deploy/base: its trust
// domain, and its Namespace.
func baseValues() map[string]any {
	return map[string]any{"trustDomain": "example.org", "namespace": map[string]any{"create": true}}
}

type objKey struct{ Kind, Namespace, Name string }

func (k objKey) String() string { return k.Kind + " " + k.Namespace + "/" + k.Name }

func keyOf(o *unstructured.Unstructured) objKey {
	return objKey{o.GetKind(), o.GetNamespace(), o.GetName()}
}

func byKey(objs []*unstructured.Unstructured) map[objKey]*unstructured.Unstructured {
	m := make(map[objKey]*unstructured.Unstructured, len(objs))
	for _, o := range objs {
		m[keyOf(o)] = o
	}
	return m
}

// configMapHash is the suffix kustomize's configMapGenerator adds.
var configMapHash = regexp.MustCompile(`^(.+-config)-[a-z0-9]{10}$`)

// helmOnly are the labels and annotations only a Helm release carries.
var helmOnly = []string{
	"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart",
	"helm.sh/resource-policy", "checksum/config",
}

// normalize removes what legitimately differs between a Helm release and
// the kustomize base (Helm's labels and annotations, kustomize's ConfigMap
// name hash) and parses the server's config file, so that the rest can be
// compared as is.
func normalize(t *testing.T, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	o = o.DeepCopy()
	for _, path := range [][]string{{"metadata"}, {"spec", "template", "metadata"}} {
		for _, field := range []string{"labels", "annotations"} {
			m, found, err := unstructured.NestedStringMap(o.Object, append(path, field)...)
			require.NoError(t, err)
			if !found {
				continue
			}
			for _, k := range helmOnly {
				delete(m, k)
			}
			if len(m) == 0 {
				unstructured.RemoveNestedField(o.Object, append(path, field)...)
			} else {
				require.NoError(t, unstructured.SetNestedStringMap(o.Object, m, append(path, field)...))
			}
		}
	}
	switch o.GetKind() {
	case "ConfigMap":
		if m := configMapHash.FindStringSubmatch(o.GetName()); m != nil {
			o.SetName(m[1])
		}
		cfg, found, err := unstructured.NestedString(o.Object, "data", "config.yaml")
		require.NoError(t, err)
		if found {
			var parsed map[string]any
			require.NoError(t, yaml.Unmarshal([]byte(cfg), &parsed))
			require.NoError(t, unstructured.SetNestedField(o.Object, parsed, "data", "config.yaml"))
		}
	case "Deployment":
		vols, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
		require.NoError(t, err)
		for _, v := range vols {
			cm, ok := v.(map[string]any)["configMap"].(map[string]any)
			if name, _ := cm["name"].(string); ok && configMapHash.MatchString(name) {
				cm["name"] = configMapHash.FindStringSubmatch(name)[1]
			}
		}
		require.NoError(t, unstructured.SetNestedSlice(o.Object, vols, "spec", "template", "spec", "volumes"))
	}
	return o
}

// renderBase renders deploy/base with the kubectl users run.
func renderBase(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return kubetest.DecodeObjects(t, kubetest.OfflineKubectl(t).Must(nil, "kustomize", baseDir))
}

// The chart with default values is deploy/base: every object of one is in
// the other, field for field, once Helm's labels and kustomize's name hash
// are set aside. A change to either that the other lacks fails here.
func TestChartEqualsKustomizeBase(t *testing.T) {
	base := byKey(renderBase(t))
	chart := byKey(mustRender(t, baseValues()))
	keys := func(m map[objKey]*unstructured.Unstructured) []string {
		var s []string
		for k := range m {
			s = append(s, normalizeKey(k).String())
		}
		sort.Strings(s)
		return s
	}
	require.Equal(t, keys(base), keys(chart), "the same objects")
	for k, b := range base {
		c := chart[k]
		if c == nil { // the ConfigMap, by its hashed name
			c = chart[normalizeKey(k)]
		}
		require.NotNil(t, c, k.String())
		assert.Equal(t, normalize(t, b).Object, normalize(t, c).Object, k.String())
	}
}

func normalizeKey(k objKey) objKey {
	if m := configMapHash.FindStringSubmatch(k.Name); m != nil && k.Kind == "ConfigMap" {
		k.Name = m[1]
	}
	return k
}

// Without namespace.create (helm install --create-namespace) the chart
// is the base without its Namespace.
func TestChartDefaultValues(t *testing.T) {
	objs := mustRender(t, map[string]any{"trustDomain": "example.org"})
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind())
		assert.Equal(t, "trustbridge", o.GetLabels()["app.kubernetes.io/name"], keyOf(o).String())
		assert.Equal(t, "Helm", o.GetLabels()["app.kubernetes.io/managed-by"], keyOf(o).String())
	}
	assert.NotContains(t, kinds, "Namespace")
	assert.NotContains(t, kinds, "ServiceMonitor")
	assert.NotContains(t, kinds, "PrometheusRule")
	assert.NotContains(t, kinds, "PersistentVolumeClaim")
	assert.Contains(t, kinds, "CustomResourceDefinition")
}

// leaves flattens values into dotted paths: maps are walked, anything
// else (lists included) is a leaf.
func leaves(prefix string, v any, out map[string]any) {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		out[prefix] = v
		return
	}
	for k, x := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		leaves(p, x, out)
	}
}

// everyValueFiles together set every value of values.yaml away from its
// default.
var everyValueFiles = []string{"full-kube.yaml", "full-file.yaml", "file-claim.yaml", "upstream-kube-csr.yaml", "agent.yaml", "platform.yaml", "pod-identity.yaml"}

func TestEveryValueIsExercised(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	var defaults map[string]any
	require.NoError(t, yaml.Unmarshal(data, &defaults))
	def := map[string]any{}
	leaves("", defaults, def)
	set := map[string][]any{}
	for _, f := range everyValueFiles {
		got := map[string]any{}
		leaves("", valuesFile(t, f), got)
		for p, v := range got {
			set[p] = append(set[p], v)
		}
	}
	for p, d := range def {
		changed := slices.ContainsFunc(set[p], func(v any) bool { return !assert.ObjectsAreEqual(d, v) })
		for q := range set { // an empty map by default: any key set in it
			changed = changed || strings.HasPrefix(q, p+".")
		}
		assert.True(t, changed, "value %s: no file of %v sets it to other than its default %v", p, everyValueFiles, d)
	}
}
