package yamlcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestFind(t *testing.T) {
	tests := []struct {
		name, doc string
		match     func(*yaml.Node) bool
		line      int // 0: nothing found
		path      string
	}{
		{"none", "a: 1\nb: [x, y]\n", IsAliasOrAnchor, 0, ""},
		{"alias in a list of mappings", "l:\n  - &i {k: 1}\n  - *i\n", IsAlias, 3, "l[1]"},
		{"alias in a nested value", "l:\n  - k: &v 1\n  - k: *v\n", IsAlias, 3, "l[1].k"},
		{"anchor first", "a: &d /x\nb: *d\n", IsAliasOrAnchor, 1, "a"},
		{"alias as a key", "a: &k x\nm: {*k : 1}\n", IsAlias, 2, "m"},
		{"alias at the top", "&r a\n", IsAliasOrAnchor, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc yaml.Node
			require.NoError(t, yaml.Unmarshal([]byte(tt.doc), &doc))
			n, path := Find(&doc, "", tt.match)
			if tt.line == 0 {
				assert.Nil(t, n)
				return
			}
			require.NotNil(t, n)
			assert.Equal(t, tt.line, n.Line)
			assert.Equal(t, tt.path, path)
		})
	}
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte("- &x a\n- *x\n"), &doc))
	_, path := Find(doc.Content[0], "federation", IsAlias)
	assert.Equal(t, "federation[1]", path, "a prefix names where the tree sits")
}
