package helmtest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the values section of the chart's README.md from values.yaml")

// The generator on a values file of every shape: comments above keys
// (prose joined, examples kept as YAML), maps with and without a comment,
// each kind of default, and text Markdown would otherwise eat.
func TestValuesMarkdown(t *testing.T) {
	values := `# The file's own comment, about no value.

# The name, e.g. <release>-x or *.example.
name: ""
image:
  # Where it comes from.
  repository: ghcr.io/x/y
  tag: v1   # after the value
# Peers, e.g.
#   - trustDomain: west.example
#     refresh: {min: 30s}
# and more prose.
peers: []
# A group.
group:
  ports: [443, 8443]
  labels: {}
  off: null
  n: 3
  # ` + "`a <b>` stays code; <c> does not." + `
  code: false
`
	docs, err := valuesDocs([]byte(values))
	require.NoError(t, err)
	var paths []string
	for _, d := range docs {
		paths = append(paths, d.path)
	}
	assert.Equal(t, []string{"name", "image.repository", "image.tag", "peers", "group", "group.ports", "group.labels", "group.off", "group.n", "group.code"}, paths,
		"leaves and commented maps in file order; image has no comment of its own")

	want := "- **`name`** (default `\"\"`): The name, e.g. \\<release>-x or \\*.example.\n" +
		"- **`image.repository`** (default `ghcr.io/x/y`): Where it comes from.\n" +
		"- **`image.tag`** (default `v1`): after the value\n" +
		"- **`peers`** (default `[]`): Peers, e.g. and more prose.\n" +
		"\n  ```yaml\n  - trustDomain: west.example\n    refresh: {min: 30s}\n  ```\n\n" +
		"- **`group`**: A group.\n" +
		"- **`group.ports`** (default `[443, 8443]`)\n" +
		"- **`group.labels`** (default `{}`)\n" +
		"- **`group.off`** (default `null`)\n" +
		"- **`group.n`** (default `3`)\n" +
		"- **`group.code`** (default `false`): `a <b>` stays code; \\<c> does not.\n"
	assert.Equal(t, want, valuesMarkdown(docs))

	_, err = valuesDocs([]byte("- a list\n"))
	assert.ErrorContains(t, err, "want a map at the top")
	_, err = valuesDocs([]byte("a: [\n"))
	assert.ErrorContains(t, err, "values.yaml")
}

func TestSpliceReadme(t *testing.T) {
	readme := "# Chart\n\nintro\n\n" + readmeBegin + "\n\nold\n\n" + readmeEnd + "\n\nafter\n"
	got, err := spliceReadme([]byte(readme), "- new\n")
	require.NoError(t, err)
	assert.Equal(t, "# Chart\n\nintro\n\n"+readmeBegin+"\n\n- new\n\n"+readmeEnd+"\n\nafter\n", string(got))
	again, err := spliceReadme(got, "- new\n")
	require.NoError(t, err)
	assert.Equal(t, string(got), string(again), "splicing is idempotent")

	_, err = spliceReadme([]byte("# Chart\n"+readmeEnd+"\n"+readmeBegin+"\n"), "x")
	assert.ErrorContains(t, err, "want the markers")
}

// The chart's README.md lists every value as values.yaml documents it:
// edit values.yaml, then run go test -run TestChartReadme -update.
func TestChartReadme(t *testing.T) {
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	docs, err := valuesDocs(values)
	require.NoError(t, err)
	path := filepath.Join(chartDir, "README.md")
	readme, err := os.ReadFile(path)
	require.NoError(t, err)
	want, err := spliceReadme(readme, valuesMarkdown(docs))
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.WriteFile(path, want, 0o644))
		return
	}
	assert.Equal(t, string(want), string(readme), "%s is stale: run go test -run TestChartReadme -update in deploy/helm/test", path)
}

// Every value has a comment in values.yaml, its own or its map's: the
// README says something about each.
func TestEveryValueDocumented(t *testing.T) {
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	docs, err := valuesDocs(values)
	require.NoError(t, err)
	commented := map[string]bool{}
	for _, d := range docs {
		if len(d.comment) > 0 {
			commented[d.path] = true
		}
	}
	for _, d := range docs {
		documented := false
		for p := d.path; p != "" && !documented; p = parentPath(p) {
			documented = commented[p]
		}
		assert.True(t, documented, "value %s: no comment above it or its map in values.yaml", d.path)
	}
}

func parentPath(p string) string {
	if i := strings.LastIndex(p, "."); i >= 0 {
		return p[:i]
	}
	return ""
}

// Whatever values.yaml holds, the generator returns docs or an error, and
// renders one list item per doc.
func FuzzValuesDocs(f *testing.F) {
	if values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml")); err == nil {
		f.Add(values)
	}
	f.Add([]byte("# a\n#   - x: 1\nk: [1, 2]\nm:\n  # `c <d>`\n  n: {}\n"))
	f.Add([]byte("a: &x {b: 1}\nc: *x\n"))
	f.Fuzz(func(t *testing.T, values []byte) {
		docs, err := valuesDocs(values)
		if err != nil {
			return
		}
		md := valuesMarkdown(docs)
		assert.Equal(t, len(docs), strings.Count(md, "\n- **`")+btoi(strings.HasPrefix(md, "- **`")), "%q", md)
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
