// Package yamlcheck holds what trustbridge's strict YAML readers (the
// federation file, the trust policy file, the server's --config) share.
// Find locates what they refuse before they read: aliases (and, for the
// server's --config, anchors), which let one value stand in many places
// and make a security configuration harder to review; one walk serves
// every reader, each with its own rule and message. Mapping reads a
// mapping strictly (known, distinct keys) and ErrorAt names a line. IsNull, Describe,
// StringProblem and DidYouMean word their errors the same way. Decode and
// Parser serve the rules documents (the trust policy, the identity map):
// one document, no anchors, every field read strictly with errors that
// name the file, the line, the rule and the field.
package yamlcheck

import (
	"fmt"
	"strconv"
	"strings"

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

// IsNull matches a null scalar ("~", "null" or no value at all).
func IsNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// Describe names what n is, for an error message: "a mapping", "a list",
// "an alias", "null", or a scalar's tag and value (`!!int "3"`).
func Describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if IsNull(n) {
			return "null"
		}
		return fmt.Sprintf("%s %q", n.ShortTag(), n.Value)
	default:
		return "an unexpected YAML node"
	}
}

// StringProblem says what keeps n from being a string value, to follow
// the field's path in an error ("must be a string, got a list"), or ""
// when n is a string scalar. Other scalars are refused rather than
// stringified: "trustDomain: 1e3" or "tier: yes" is more likely a mistake
// than meant, and quoting it is easy.
func StringProblem(n *yaml.Node) string {
	switch {
	case n.Kind != yaml.ScalarNode:
		return "must be a string, got " + Describe(n)
	case IsNull(n):
		return "has no value"
	case n.ShortTag() != "!!str":
		return "must be a string, got " + Describe(n) + "; quote it if it is meant as one"
	}
	return ""
}

// DidYouMean catches the most common slip in an unknown key, wrong
// capitalisation ("trustdomain", "spiffeId"): it returns
// ` (did you mean "trustDomain"?)` to append to the message, or "".
func DidYouMean(s string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(s, k) && k != s {
			return fmt.Sprintf(" (did you mean %q?)", k)
		}
	}
	return ""
}
