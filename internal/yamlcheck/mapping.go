package yamlcheck

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Entry is one entry of a YAML mapping; the key node is kept for errors
// that are about the key's presence rather than its value.
type Entry struct {
	Key, Value *yaml.Node
}

// Mapping checks that n is a mapping whose keys are all known and
// distinct, and returns its entries by key. where names n in errors
// ("federation[1]"). yaml/v3 reports duplicate keys only when decoding
// into Go values, not into a yaml.Node, so the check is ours; merge keys
// (<<) are refused, since they let one value stand in many places.
func Mapping(n *yaml.Node, where string, known []string) (map[string]*Entry, error) {
	if n.Kind != yaml.MappingNode {
		return nil, ErrorAt(n, "%s must be a mapping, got %s", where, Describe(n))
	}
	m := make(map[string]*Entry, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, ErrorAt(k, "%s: keys must be strings, got %s", where, Describe(k))
		}
		if k.ShortTag() == "!!merge" {
			return nil, ErrorAt(k, "%s: merge keys (<<) are not supported", where)
		}
		if first, dup := m[k.Value]; dup {
			return nil, ErrorAt(k, "duplicate key %q in %s (first at line %d)", k.Value, where, first.Key.Line)
		}
		if !slices.Contains(known, k.Value) {
			return nil, ErrorAt(k, "unknown key %q in %s%s (known: %s)", k.Value, where, DidYouMean(k.Value, known), strings.Join(known, ", "))
		}
		m[k.Value] = &Entry{Key: k, Value: v}
	}
	return m, nil
}

// ErrorAt is an error about n: "line <n's line>: <message>".
func ErrorAt(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("line %d: "+format, append([]any{n.Line}, args...)...)
}
