package yamlcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDecode(t *testing.T) {
	n, err := Decode(nil, "file:x.yaml", "policy")
	require.NoError(t, err)
	assert.Nil(t, n, "no document")

	n, err = Decode([]byte("a: 1\n"), "file:x.yaml", "policy")
	require.NoError(t, err)
	require.NotNil(t, n)
	assert.Equal(t, yaml.DocumentNode, n.Kind)

	_, err = Decode([]byte("a: 1\n---\nb: 2\n"), "file:x.yaml", "policy")
	assert.EqualError(t, err, "file:x.yaml:2: a second YAML document; put the whole policy in one mapping")
	_, err = Decode([]byte("a: [\n"), "file:x.yaml", "policy")
	assert.ErrorContains(t, err, "file:x.yaml: yaml: ")
}

func TestParserRoot(t *testing.T) {
	p := &Parser{Origin: "file:x.yaml"}
	for _, doc := range []string{"", "~\n", "# only a comment\n"} {
		root, err := Decode([]byte(doc), p.Origin, "policy")
		require.NoError(t, err)
		n, err := p.Root(root, "a trust policy")
		require.NoError(t, err, doc)
		assert.Nil(t, n, "empty document %q", doc)
	}
	root, err := Decode([]byte("a: &x 1\nb: *x\n"), p.Origin, "policy")
	require.NoError(t, err)
	_, err = p.Root(root, "a trust policy")
	assert.EqualError(t, err, "file:x.yaml:1: a: YAML anchors and aliases are not allowed in a trust policy: write each value out")
	root, err = Decode([]byte("&top\na: 1\n"), p.Origin, "policy")
	require.NoError(t, err)
	_, err = p.Root(root, "a trust policy")
	assert.ErrorContains(t, err, "the top level: YAML anchors")
}

func TestParserErrors(t *testing.T) {
	node := func(t *testing.T, doc string) *yaml.Node {
		t.Helper()
		var n yaml.Node
		require.NoError(t, yaml.Unmarshal([]byte(doc), &n))
		return n.Content[0]
	}
	p := &Parser{Origin: "file:x.yaml", Within: `rule 2 "payments"`}
	for _, tc := range []struct {
		name, doc, want string
		read            func(*yaml.Node) error
	}{
		{"mapping kind", "- a\n", `file:x.yaml:1: rule 2 "payments": top must be a mapping, got a list`, func(n *yaml.Node) error { _, err := p.Mapping(n, "top", []string{"a"}); return err }},
		{"unknown key", "a: 1\nb: 2\n", `file:x.yaml:2: rule 2 "payments": unknown key "b" in top (known: a, a2)`, func(n *yaml.Node) error { _, err := p.Mapping(n, "top", []string{"a", "a2"}); return err }},
		{"did you mean", "A: 1\n", `file:x.yaml:1: rule 2 "payments": unknown key "A" in top (did you mean "a"?) (known: a)`, func(n *yaml.Node) error { _, err := p.Mapping(n, "top", []string{"a"}); return err }},
		{"duplicate", "a: 1\na: 2\n", `file:x.yaml:2: rule 2 "payments": duplicate key "a" in top (first at line 1)`, func(n *yaml.Node) error { _, err := p.Mapping(n, "top", []string{"a"}); return err }},
		{"null key", "~: 1\n", `file:x.yaml:1: rule 2 "payments": top: keys must be strings, got null`, func(n *yaml.Node) error { _, err := p.StringMap(n, "top"); return err }},
		{"merge key", "<<: {a: 1}\n", `file:x.yaml:1: rule 2 "payments": top: merge keys (<<) are not supported`, func(n *yaml.Node) error { _, err := p.StringMap(n, "top"); return err }},
		{"list kind", "a: 1\n", `file:x.yaml:1: rule 2 "payments": top must be a list, got a mapping`, func(n *yaml.Node) error { _, err := p.List(n, "top"); return err }},
		{"string kind", "[a, 3]\n", `file:x.yaml:1: rule 2 "payments": top[1] must be a string, got !!int "3"; quote it if it is meant as one`, func(n *yaml.Node) error { _, err := p.Strings(n, "top"); return err }},
		{"expression key", "matchExpressions: [{operator: In}]\n", `file:x.yaml:1: rule 2 "payments": top.matchExpressions[0]: missing required key "key"`, func(n *yaml.Node) error { _, err := p.LabelSelector(n, "top"); return err }},
		{"label value", "matchLabels: {app: [x]}\n", `file:x.yaml:1: rule 2 "payments": top.matchLabels.app must be a string, got a list`, func(n *yaml.Node) error { _, err := p.LabelSelector(n, "top"); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.EqualError(t, tc.read(node(t, tc.doc)), tc.want)
		})
	}
}

func TestParserLabelSelector(t *testing.T) {
	var n yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte("matchLabels: {app: web}\nmatchExpressions:\n  - {key: tier, operator: NotIn, values: [canary]}\n  - {key: gpu, operator: Exists}\n"), &n))
	p := &Parser{Origin: "file:x.yaml"}
	ls, err := p.LabelSelector(n.Content[0], "labels")
	require.NoError(t, err)
	assert.Equal(t, &metav1.LabelSelector{
		MatchLabels: map[string]string{"app": "web"},
		MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"canary"}},
			{Key: "gpu", Operator: metav1.LabelSelectorOpExists},
		},
	}, ls)

	empty, err := p.LabelSelector(&yaml.Node{Kind: yaml.MappingNode}, "labels")
	require.NoError(t, err, "whether an empty selector is allowed is the caller's rule")
	assert.Equal(t, &metav1.LabelSelector{}, empty)
}
