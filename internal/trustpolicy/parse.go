package trustpolicy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/trustbridge/trustbridge/internal/yamlcheck"
)

// Limits on a policy document. A policy is operator input, but it is
// re-read on every change and held by every SDS stream's decision: a
// runaway generator should get an error, not a server out of memory.
const (
	// MaxDocumentSize caps a policy file; 10,000 rules fit well within it.
	MaxDocumentSize = 1 << 20
	// MaxRules caps the rules of one document.
	MaxRules = 10000
)

// Document is a parsed policy file, or the trustPolicy section of --config.
type Document struct {
	// Default is "" when the document does not set one.
	Default Default
	Rules   []Rule
}

// Keys of the schema.
var (
	documentKeys  = []string{"default", "rules"}
	ruleKeys      = []string{"name", "workloads", "trustDomains"}
	selectorKeys  = []string{"spiffeID", "namespace", "labels"}
	labelKeys     = []string{"matchLabels", "matchExpressions"}
	expressionKey = []string{"key", "operator", "values"}
	grantKeys     = []string{"name", "peers"}
)

// Parse parses a policy document (YAML: default, rules[]); origin names the
// file in errors ("file:/etc/trustbridge/policy.yaml") and in each Rule's
// Origin ("<origin>:<line>"). An empty document has no rules and no
// default. Errors name the line, the rule (number and name) and the field:
//
//	trustpolicy: file:policy.yaml:14: rule 2 "payments": trustDomains[0].peers[1]: pattern ...
//
// Parse checks every rule as Compile does, except what needs the local
// trust domain (selectors of another trust domain, a grant of the local
// one), which Compile reports with the rule's Origin.
func Parse(data []byte, origin string) (Document, error) {
	if len(data) > MaxDocumentSize {
		return Document{}, fmt.Errorf("trustpolicy: %s: %d bytes, over the %d byte limit of a policy document; split it into fewer, broader rules", origin, len(data), MaxDocumentSize)
	}
	root, err := documentRoot(data, origin)
	if err != nil {
		return Document{}, fmt.Errorf("trustpolicy: %w", err)
	}
	return ParseNode(root, origin)
}

// documentRoot decodes the one YAML document in data; nil when empty.
func documentRoot(data []byte, origin string) (*yaml.Node, error) {
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
		return nil, fmt.Errorf("%s:%d: a second YAML document; put the whole policy in one mapping", origin, extra.Line)
	}
	return &doc, nil
}

// ParseNode parses a document already read as YAML (the --config file's
// trustPolicy key), keeping that file's line numbers. A nil or null node
// is an empty document.
func ParseNode(n *yaml.Node, origin string) (Document, error) {
	p := &parser{origin: origin}
	doc, err := p.document(n)
	if err != nil {
		return Document{}, fmt.Errorf("trustpolicy: %w", err)
	}
	return doc, nil
}

type parser struct {
	origin string
	inRule string // `rule 2 "payments"` while inside one
}

// errAt is an error at n's line, inside the current rule if any.
func (p *parser) errAt(n *yaml.Node, format string, args ...any) error {
	where := fmt.Sprintf("%s:%d: ", p.origin, n.Line)
	if p.inRule != "" {
		where += p.inRule + ": "
	}
	return fmt.Errorf(where+format, args...)
}

func (p *parser) document(n *yaml.Node) (Document, error) {
	if n != nil && n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return Document{}, nil
		}
		n = n.Content[0]
	}
	if n == nil || yamlcheck.IsNull(n) {
		return Document{}, nil
	}
	if found, path := yamlcheck.Find(n, "", yamlcheck.IsAliasOrAnchor); found != nil {
		if path == "" {
			path = "the top level"
		}
		return Document{}, p.errAt(found, "%s: YAML anchors and aliases are not allowed in a trust policy: write each value out", path)
	}
	m, err := p.mapping(n, "the policy", documentKeys)
	if err != nil {
		return Document{}, err
	}
	var doc Document
	if v := m["default"]; v != nil {
		s, err := p.scalar(v, "default")
		if err != nil {
			return Document{}, err
		}
		if doc.Default, err = ParseDefault(s); err != nil {
			return Document{}, p.errAt(v, "default: %w", err)
		}
	}
	if v := m["rules"]; v != nil {
		if doc.Rules, err = p.rules(v); err != nil {
			return Document{}, err
		}
	}
	return doc, nil
}

func (p *parser) rules(n *yaml.Node) ([]Rule, error) {
	items, err := p.list(n, "rules")
	if err != nil {
		return nil, err
	}
	if len(items) > MaxRules {
		return nil, p.errAt(n, "rules: %d rules, over the limit of %d; select workloads by prefix or namespace to need fewer", len(items), MaxRules)
	}
	out := make([]Rule, 0, len(items))
	names := make(map[string]int, len(items))
	for i, item := range items {
		r, err := p.rule(i, item)
		if err != nil {
			return nil, err
		}
		if line, dup := names[r.Name]; dup {
			return nil, p.errAt(item, "rule %d %q: name already used by the rule at line %d", i+1, r.Name, line)
		}
		names[r.Name] = item.Line
		out = append(out, r)
	}
	return out, nil
}

func (p *parser) rule(i int, n *yaml.Node) (Rule, error) {
	p.inRule = fmt.Sprintf("rule %d", i+1)
	defer func() { p.inRule = "" }()
	m, err := p.mapping(n, "the rule", ruleKeys)
	if err != nil {
		return Rule{}, err
	}
	r := Rule{Origin: fmt.Sprintf("%s:%d", p.origin, n.Line)}
	if m["name"] == nil {
		return Rule{}, p.errAt(n, "missing required key \"name\"")
	}
	if r.Name, err = p.scalar(m["name"], "name"); err != nil {
		return Rule{}, err
	}
	if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 {
		return Rule{}, p.errAt(m["name"], "name %q: %s (rule names share the namespace of ClusterTrustPolicy resource names)", r.Name, strings.Join(errs, "; "))
	}
	p.inRule = fmt.Sprintf("rule %d %q", i+1, r.Name)
	if r.Workloads, err = p.selectors(m["workloads"]); err != nil {
		return Rule{}, err
	}
	if r.TrustDomains, err = p.grants(m["trustDomains"]); err != nil {
		return Rule{}, err
	}
	// What is left for compileRule (a missing list, a trust domain listed
	// twice) is reported at the rule's line.
	if _, err := compileRule(spiffeid.TrustDomain{}, r); err != nil {
		return Rule{}, p.errAt(n, "%w", err)
	}
	return r, nil
}

func (p *parser) selectors(n *yaml.Node) ([]Selector, error) {
	items, err := p.list(n, "workloads")
	if err != nil {
		return nil, err
	}
	out := make([]Selector, 0, len(items))
	for i, item := range items {
		s, err := p.selector(fmt.Sprintf("workloads[%d]", i), item)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func (p *parser) selector(where string, n *yaml.Node) (Selector, error) {
	m, err := p.mapping(n, where, selectorKeys)
	if err != nil {
		return Selector{}, err
	}
	var s Selector
	if v := m["spiffeID"]; v != nil {
		if s.SPIFFEID, err = p.pattern(v, where+".spiffeID"); err != nil {
			return Selector{}, err
		}
	}
	if v := m["namespace"]; v != nil {
		if s.Namespace, err = p.scalar(v, where+".namespace"); err != nil {
			return Selector{}, err
		}
		if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
			return Selector{}, p.errAt(v, "%s.namespace %q: %s", where, s.Namespace, strings.Join(errs, "; "))
		}
	}
	if v := m["labels"]; v != nil {
		if s.Labels, err = p.labelSelector(v, where+".labels"); err != nil {
			return Selector{}, err
		}
	}
	if s.SPIFFEID == "" && s.Namespace == "" && s.Labels == nil {
		return Selector{}, p.errAt(n, "%s: empty selector: set spiffeID, namespace or labels", where)
	}
	return s, nil
}

func (p *parser) pattern(n *yaml.Node, where string) (string, error) {
	s, err := p.scalar(n, where)
	if err != nil {
		return "", err
	}
	if _, err := ParsePattern(s); err != nil {
		return "", p.errAt(n, "%s: %w", where, err)
	}
	return s, nil
}

func (p *parser) labelSelector(n *yaml.Node, where string) (*metav1.LabelSelector, error) {
	m, err := p.mapping(n, where, labelKeys)
	if err != nil {
		return nil, err
	}
	ls := &metav1.LabelSelector{}
	if v := m["matchLabels"]; v != nil {
		if ls.MatchLabels, err = p.stringMap(v, where+".matchLabels"); err != nil {
			return nil, err
		}
	}
	if v := m["matchExpressions"]; v != nil {
		items, err := p.list(v, where+".matchExpressions")
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
	if len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0 {
		// An empty selector matches everything: say so explicitly.
		return nil, p.errAt(n, "%s: empty label selector; set matchLabels or matchExpressions", where)
	}
	if _, err := metav1.LabelSelectorAsSelector(ls); err != nil {
		return nil, p.errAt(n, "%s: %w", where, err)
	}
	return ls, nil
}

func (p *parser) stringMap(n *yaml.Node, where string) (map[string]string, error) {
	keys := func(string) bool { return true }
	pairs, err := p.pairs(n, where, keys)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		v, err := p.scalar(kv[1], where+"."+kv[0].Value)
		if err != nil {
			return nil, err
		}
		out[kv[0].Value] = v
	}
	return out, nil
}

func (p *parser) expression(n *yaml.Node, where string) (metav1.LabelSelectorRequirement, error) {
	var e metav1.LabelSelectorRequirement
	m, err := p.mapping(n, where, expressionKey)
	if err != nil {
		return e, err
	}
	for _, k := range []string{"key", "operator"} {
		if m[k] == nil {
			return e, p.errAt(n, "%s: missing required key %q", where, k)
		}
	}
	if e.Key, err = p.scalar(m["key"], where+".key"); err != nil {
		return e, err
	}
	op, err := p.scalar(m["operator"], where+".operator")
	if err != nil {
		return e, err
	}
	e.Operator = metav1.LabelSelectorOperator(op)
	if v := m["values"]; v != nil {
		if e.Values, err = p.strings(v, where+".values"); err != nil {
			return e, err
		}
	}
	return e, nil
}

func (p *parser) grants(n *yaml.Node) ([]TrustDomainGrant, error) {
	items, err := p.list(n, "trustDomains")
	if err != nil {
		return nil, err
	}
	out := make([]TrustDomainGrant, 0, len(items))
	for i, item := range items {
		g, err := p.grant(fmt.Sprintf("trustDomains[%d]", i), item)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

func (p *parser) grant(where string, n *yaml.Node) (TrustDomainGrant, error) {
	m, err := p.mapping(n, where, grantKeys)
	if err != nil {
		return TrustDomainGrant{}, err
	}
	if m["name"] == nil {
		return TrustDomainGrant{}, p.errAt(n, "%s: missing required key \"name\"", where)
	}
	var g TrustDomainGrant
	if g.TrustDomain, err = p.scalar(m["name"], where+".name"); err != nil {
		return g, err
	}
	if _, err := compileGrant(spiffeid.TrustDomain{}, TrustDomainGrant{TrustDomain: g.TrustDomain}); err != nil {
		return g, p.errAt(m["name"], "%s.name: %w", where, err)
	}
	if m["peers"] == nil {
		return g, nil
	}
	items, err := p.list(m["peers"], where+".peers")
	if err != nil {
		return g, err
	}
	for i, item := range items {
		at := fmt.Sprintf("%s.peers[%d]", where, i)
		s, err := p.pattern(item, at)
		if err != nil {
			return g, err
		}
		if td := MustParsePattern(s).TrustDomain(); td.Name() != g.TrustDomain {
			return g, p.errAt(item, "%s: %q is not in trust domain %q", at, s, g.TrustDomain)
		}
		g.Peers = append(g.Peers, s)
	}
	return g, nil
}

// mapping reads n as a mapping of the known keys, refusing anything else.
func (p *parser) mapping(n *yaml.Node, where string, known []string) (map[string]*yaml.Node, error) {
	pairs, err := p.pairs(n, where, func(k string) bool { return slices.Contains(known, k) })
	if err != nil {
		var u unknownKey
		if errors.As(err, &u) {
			return nil, p.errAt(u.node, "unknown key %q in %s%s (known: %s)", u.node.Value, where, yamlcheck.DidYouMean(u.node.Value, known), strings.Join(known, ", "))
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
func (p *parser) pairs(n *yaml.Node, where string, known func(string) bool) ([][2]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, p.errAt(n, "%s must be a mapping, got %s", where, yamlcheck.Describe(n))
	}
	out := make([][2]*yaml.Node, 0, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null":
			return nil, p.errAt(k, "%s: keys must be strings, got %s", where, yamlcheck.Describe(k))
		case k.ShortTag() == "!!merge":
			return nil, p.errAt(k, "%s: merge keys (<<) are not supported", where)
		case lines[k.Value] != 0:
			return nil, p.errAt(k, "duplicate key %q in %s (first at line %d)", k.Value, where, lines[k.Value])
		case !known(k.Value):
			return nil, unknownKey{node: k}
		}
		lines[k.Value] = k.Line
		out = append(out, [2]*yaml.Node{k, v})
	}
	return out, nil
}

// list reads n as a list; null is an empty list.
func (p *parser) list(n *yaml.Node, where string) ([]*yaml.Node, error) {
	switch {
	case n == nil || yamlcheck.IsNull(n):
		return nil, nil
	case n.Kind != yaml.SequenceNode:
		return nil, p.errAt(n, "%s must be a list, got %s", where, yamlcheck.Describe(n))
	}
	return n.Content, nil
}

func (p *parser) strings(n *yaml.Node, where string) ([]string, error) {
	items, err := p.list(n, where)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(items))
	for i, item := range items {
		s, err := p.scalar(item, fmt.Sprintf("%s[%d]", where, i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// scalar returns the value of a string scalar. Other scalars are refused
// rather than stringified: "namespace: 1e3" or "tier: yes" is more likely
// a mistake than meant.
func (p *parser) scalar(n *yaml.Node, where string) (string, error) {
	if problem := yamlcheck.StringProblem(n); problem != "" {
		return "", p.errAt(n, "%s %s", where, problem)
	}
	return n.Value, nil
}
