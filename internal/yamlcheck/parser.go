package yamlcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Decode decodes the one YAML document in data; nil when data holds none.
// origin names the file in errors; a second document is refused with the
// hint to put the whole <what> ("policy") in one mapping.
func Decode(data []byte, origin, what string) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%s: %w", origin, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("%s: %w", origin, err)
		}
		return nil, fmt.Errorf("%s:%d: a second YAML document; put the whole %s in one mapping", origin, extra.Line, what)
	}
	return &doc, nil
}

// Parser reads the nodes of a rules document (the trust policy, the
// identity map) strictly, each refusal an error naming the file, the line,
// the part being read and the field:
//
//	file:policy.yaml:14: rule 2 "payments": trustDomains[0].name must be a string, got a list
//
// The where arguments name the field ("workloads[0].namespace").
type Parser struct {
	// Origin names the file ("file:/etc/trustbridge/policy.yaml").
	Origin string
	// Within names the part being read (`rule 2 "payments"`), "" at the
	// top level.
	Within string
}

// ErrorAt is an error at n's line, within the current part if any.
func (p *Parser) ErrorAt(n *yaml.Node, format string, args ...any) error {
	where := fmt.Sprintf("%s:%d: ", p.Origin, n.Line)
	if p.Within != "" {
		where += p.Within + ": "
	}
	return fmt.Errorf(where+format, args...)
}

// Root returns the top-level node of a document (a document node, or a
// section of a larger file), nil when it is empty or null. Anchors and
// aliases anywhere in it are refused: a security configuration is
// reviewed as written, so each value must be written out; what names
// the document in that error ("a trust policy").
func (p *Parser) Root(n *yaml.Node, what string) (*yaml.Node, error) {
	if n != nil && n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil, nil
		}
		n = n.Content[0]
	}
	if n == nil || IsNull(n) {
		return nil, nil
	}
	if found, path := Find(n, "", IsAliasOrAnchor); found != nil {
		if path == "" {
			path = "the top level"
		}
		return nil, p.ErrorAt(found, "%s: YAML anchors and aliases are not allowed in %s: write each value out", path, what)
	}
	return n, nil
}

// Mapping reads n as a mapping of the known keys, refusing anything else.
func (p *Parser) Mapping(n *yaml.Node, where string, known []string) (map[string]*yaml.Node, error) {
	pairs, err := p.pairs(n, where, func(k string) bool { return slices.Contains(known, k) })
	if err != nil {
		var u unknownKey
		if errors.As(err, &u) {
			return nil, p.ErrorAt(u.node, "unknown key %q in %s%s (known: %s)", u.node.Value, where, DidYouMean(u.node.Value, known), strings.Join(known, ", "))
		}
		return nil, err
	}
	m := make(map[string]*yaml.Node, len(pairs))
	for _, kv := range pairs {
		m[kv[0].Value] = kv[1]
	}
	return m, nil
}

type unknownKey struct{ node *yaml.Node }

func (unknownKey) Error() string { return "unknown key" }

// pairs reads n as a mapping with string keys for which known holds, no
// duplicates and no merge keys.
func (p *Parser) pairs(n *yaml.Node, where string, known func(string) bool) ([][2]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, p.ErrorAt(n, "%s must be a mapping, got %s", where, Describe(n))
	}
	out := make([][2]*yaml.Node, 0, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null":
			return nil, p.ErrorAt(k, "%s: keys must be strings, got %s", where, Describe(k))
		case k.ShortTag() == "!!merge":
			return nil, p.ErrorAt(k, "%s: merge keys (<<) are not supported", where)
		case lines[k.Value] != 0:
			return nil, p.ErrorAt(k, "duplicate key %q in %s (first at line %d)", k.Value, where, lines[k.Value])
		case !known(k.Value):
			return nil, unknownKey{node: k}
		}
		lines[k.Value] = k.Line
		out = append(out, [2]*yaml.Node{k, v})
	}
	return out, nil
}

// List reads n as a list; nil and null are an empty list.
func (p *Parser) List(n *yaml.Node, where string) ([]*yaml.Node, error) {
	switch {
	case n == nil || IsNull(n):
		return nil, nil
	case n.Kind != yaml.SequenceNode:
		return nil, p.ErrorAt(n, "%s must be a list, got %s", where, Describe(n))
	}
	return n.Content, nil
}

// String returns the value of a string scalar. Other scalars are refused
// rather than stringified: "namespace: 1e3" or "tier: yes" is more likely
// a mistake than meant (see StringProblem).
func (p *Parser) String(n *yaml.Node, where string) (string, error) {
	if problem := StringProblem(n); problem != "" {
		return "", p.ErrorAt(n, "%s %s", where, problem)
	}
	return n.Value, nil
}

// Strings reads n as a list of strings; nil and null are an empty list.
func (p *Parser) Strings(n *yaml.Node, where string) ([]string, error) {
	items, err := p.List(n, where)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(items))
	for i, item := range items {
		s, err := p.String(item, fmt.Sprintf("%s[%d]", where, i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// StringMap reads n as a mapping of any distinct string keys to strings
// (Kubernetes labels).
func (p *Parser) StringMap(n *yaml.Node, where string) (map[string]string, error) {
	pairs, err := p.pairs(n, where, func(string) bool { return true })
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		v, err := p.String(kv[1], where+"."+kv[0].Value)
		if err != nil {
			return nil, err
		}
		out[kv[0].Value] = v
	}
	return out, nil
}

// Keys of a Kubernetes label selector.
var (
	labelSelectorKeys = []string{"matchLabels", "matchExpressions"}
	expressionKeys    = []string{"key", "operator", "values"}
)

// LabelSelector reads n as a Kubernetes label selector (matchLabels,
// matchExpressions), as its YAML is written in a resource. It checks the
// document's shape only: whether an empty selector is allowed, and what
// the operators and values must be, is the caller's to check (with
// metav1.LabelSelectorAsSelector, say), as the rules of each document
// differ.
func (p *Parser) LabelSelector(n *yaml.Node, where string) (*metav1.LabelSelector, error) {
	m, err := p.Mapping(n, where, labelSelectorKeys)
	if err != nil {
		return nil, err
	}
	ls := &metav1.LabelSelector{}
	if v := m["matchLabels"]; v != nil {
		if ls.MatchLabels, err = p.StringMap(v, where+".matchLabels"); err != nil {
			return nil, err
		}
	}
	if v := m["matchExpressions"]; v != nil {
		items, err := p.List(v, where+".matchExpressions")
		if err != nil {
			return nil, err
		}
		for i, item := range items {
			e, err := p.expression(item, fmt.Sprintf("%s.matchExpressions[%d]", where, i))
			if err != nil {
				return nil, err
			}
			ls.MatchExpressions = append(ls.MatchExpressions, e)
		}
	}
	return ls, nil
}

func (p *Parser) expression(n *yaml.Node, where string) (metav1.LabelSelectorRequirement, error) {
	var e metav1.LabelSelectorRequirement
	m, err := p.Mapping(n, where, expressionKeys)
	if err != nil {
		return e, err
	}
	for _, k := range []string{"key", "operator"} {
		if m[k] == nil {
			return e, p.ErrorAt(n, "%s: missing required key %q", where, k)
		}
	}
	if e.Key, err = p.String(m["key"], where+".key"); err != nil {
		return e, err
	}
	op, err := p.String(m["operator"], where+".operator")
	if err != nil {
		return e, err
	}
	e.Operator = metav1.LabelSelectorOperator(op)
	if v := m["values"]; v != nil {
		if e.Values, err = p.Strings(v, where+".values"); err != nil {
			return e, err
		}
	}
	return e, nil
}
