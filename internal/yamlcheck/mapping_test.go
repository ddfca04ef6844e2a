package yamlcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestMapping(t *testing.T) {
	node := func(t *testing.T, doc string) *yaml.Node {
		t.Helper()
		var n yaml.Node
		require.NoError(t, yaml.Unmarshal([]byte(doc), &n))
		return n.Content[0]
	}
	m, err := Mapping(node(t, "a: 1\nb: [x]\n"), "top", []string{"a", "b", "c"})
	require.NoError(t, err)
	require.Len(t, m, 2)
	assert.Equal(t, "1", m["a"].Value.Value)
	assert.Equal(t, 2, m["b"].Key.Line)

	for _, tc := range []struct{ doc, want string }{
		{"- a\n", "line 1: top must be a mapping, got a list"},
		{"a: 1\na: 2\n", `line 2: duplicate key "a" in top (first at line 1)`},
		{"a: 1\nbb: 2\n", `line 2: unknown key "bb" in top`},
		{"? [a]\n: 1\n", "line 1: top: keys must be strings"},
		{"<<: {a: 1}\n", "line 1: top: merge keys (<<) are not supported"},
	} {
		_, err := Mapping(node(t, tc.doc), "top", []string{"a", "b"})
		assert.ErrorContains(t, err, tc.want, tc.doc)
	}
}
