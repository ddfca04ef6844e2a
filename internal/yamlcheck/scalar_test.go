package yamlcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// value parses "v: <doc>" and returns v's node, as the readers meet it.
func value(t *testing.T, doc string) *yaml.Node {
	t.Helper()
	var n yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte("a: &a x\nv: "+doc+"\n"), &n))
	m := n.Content[0]
	require.Equal(t, yaml.MappingNode, m.Kind)
	return m.Content[3]
}

func TestDescribeAndStringProblem(t *testing.T) {
	tests := []struct {
		doc, describe, problem string
		null                   bool
	}{
		{`spiffe://x.test`, `!!str "spiffe://x.test"`, "", false},
		{`"1e3"`, `!!str "1e3"`, "", false},
		{`1e3`, `!!float "1e3"`, `must be a string, got !!float "1e3"; quote it if it is meant as one`, false},
		{`yes`, `!!str "yes"`, "", false}, // YAML 1.2: yes is a string
		{`true`, `!!bool "true"`, `must be a string, got !!bool "true"; quote it if it is meant as one`, false},
		{`~`, "null", "has no value", true},
		{``, "null", "has no value", true},
		{`[x]`, "a list", "must be a string, got a list", false},
		{`{k: x}`, "a mapping", "must be a string, got a mapping", false},
		{`*a`, "an alias", "must be a string, got an alias", false},
	}
	for _, tt := range tests {
		t.Run(tt.doc, func(t *testing.T) {
			n := value(t, tt.doc)
			assert.Equal(t, tt.describe, Describe(n))
			assert.Equal(t, tt.problem, StringProblem(n))
			assert.Equal(t, tt.null, IsNull(n))
		})
	}
	assert.Equal(t, "an unexpected YAML node", Describe(&yaml.Node{}))
}

func TestDidYouMean(t *testing.T) {
	known := []string{"trustDomain", "spiffeID"}
	for _, tt := range []struct{ key, want string }{
		{"trustdomain", ` (did you mean "trustDomain"?)`},
		{"spiffeId", ` (did you mean "spiffeID"?)`},
		{"trustDomain", ""}, // known as spelled: no hint
		{"peers", ""},
	} {
		t.Run(tt.key, func(t *testing.T) { assert.Equal(t, tt.want, DidYouMean(tt.key, known)) })
	}
}
