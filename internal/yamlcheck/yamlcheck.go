// Package yamlcheck finds what trustbridge's YAML configurations refuse
// before they are read: aliases (and, for the server's --config, anchors),
// which let one value stand in many places and make a security
// configuration harder to review. One walk serves both readers, each with
// its own rule and message.
package yamlcheck

import (
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Find returns the first node, in document order, of the tree under n (n
// included) for which match holds, with its path: mapping keys joined by
// ".", list indexes in brackets, after prefix ("federation[1].trustDomain").
// A mapping key's own path is its mapping's. It returns nil when no node
// matches.
func Find(n *yaml.Node, prefix string, match func(*yaml.Node) bool) (*yaml.Node, string) {
	if n == nil {
		return nil, ""
	}
	if match(n) {
		return n, prefix
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if found, path := Find(c, prefix, match); found != nil {
				return found, path
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if found, path := Find(c, prefix+"["+strconv.Itoa(i)+"]", match); found != nil {
				return found, path
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if found, path := Find(k, prefix, match); found != nil {
				return found, path
			}
			if found, path := Find(v, join(prefix, k.Value), match); found != nil {
				return found, path
			}
		}
	}
	return nil, ""
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// IsAlias matches an alias (*name).
func IsAlias(n *yaml.Node) bool { return n.Kind == yaml.AliasNode }

// IsAliasOrAnchor matches an alias or a node with an anchor (&name).
func IsAliasOrAnchor(n *yaml.Node) bool { return n.Kind == yaml.AliasNode || n.Anchor != "" }
