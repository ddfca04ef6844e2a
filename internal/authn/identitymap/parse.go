package identitymap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/yamlcheck"
)

// MaxDocumentSize caps an identity map file; 10,000 rules fit within it.
// It is operator input, but re-read on every change: a runaway generator
// should get an error, not an agent out of memory.
const MaxDocumentSize = 1 << 20

// Document is a parsed identity map file.
type Document struct {
	// Default is "" when the document does not set one.
	Default Default
	Rules   []Rule
}

// Keys of the schema.
var (
	documentKeys   = []string{"default", "rules"}
	ruleKeys       = []string{"name", "workloads", "spiffeID", "ttl", "dnsNames"}
	selectorKeys   = []string{"kubernetes", "namespace", "serviceAccount", "podLabels", "uid", "gid", "binaryPath", "binarySHA256"}
	labelKeys      = []string{"matchLabels", "matchExpressions"}
	expressionKeys = []string{"key", "operator", "values"}
)

// Parse parses an identity map document (YAML: default, rules[]); origin
// names the file in errors ("file:/etc/trustbridge/identities.yaml") and
// in each Rule's Origin ("<origin>:<line>"). An empty document has no
// rules and no default. Errors name the line, the rule and the field:
//
//	identitymap: file:ids.yaml:9: rule 2 "payments": workloads[0].uid: ...
//
// Parse checks every rule as Compile does, except what needs the local
// trust domain and the maximum TTL, which Compile reports with the rule's
// Origin.
func Parse(data []byte, origin string) (Document, error) {
	if len(data) > MaxDocumentSize {
		return Document{}, fmt.Errorf("identitymap: %s: %d bytes, over the %d byte limit of an identity map", origin, len(data), MaxDocumentSize)
	}
	root, err := documentRoot(data, origin)
	if err != nil {
		return Document{}, fmt.Errorf("identitymap: %w", err)
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
		return nil, fmt.Errorf("%s:%d: a second YAML document; put the whole identity map in one mapping", origin, extra.Line)
	}
	return &doc, nil
}

// ParseNode parses a document already read as YAML (a section of a
// larger configuration file), keeping that file's line numbers. A nil or
// null node is an empty document.
func ParseNode(n *yaml.Node, origin string) (Document, error) {
	p := &parser{origin: origin}
	doc, err := p.document(n)
	if err != nil {
		return Document{}, fmt.Errorf("identitymap: %w", err)
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
		return Document{}, p.errAt(found, "%s: YAML anchors and aliases are not allowed in an identity map: write each value out", path)
	}
	m, err := p.mapping(n, "the identity map", documentKeys)
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
		return nil, p.errAt(n, "rules: %d rules, over the limit of %d", len(items), MaxRules)
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
	for _, k := range []string{"name", "workloads", "spiffeID"} {
		if m[k] == nil {
			return Rule{}, p.errAt(n, "missing required key %q", k)
		}
	}
	r := Rule{Origin: fmt.Sprintf("%s:%d", p.origin, n.Line)}
	if r.Name, err = p.scalar(m["name"], "name"); err != nil {
		return Rule{}, err
	}
	if err := checkName(r.Name); err != nil {
		return Rule{}, p.errAt(m["name"], "%w (rule names share the namespace of IdentityMapping resource names)", err)
	}
	p.inRule = fmt.Sprintf("rule %d %q", i+1, r.Name)
	if r.Workloads, err = p.selectors(m["workloads"]); err != nil {
		return Rule{}, err
	}
	if err := p.templates(m, &r); err != nil {
		return Rule{}, err
	}
	if v := m["ttl"]; v != nil {
		if r.TTL, err = p.ttl(v); err != nil {
			return Rule{}, err
		}
	}
	// What is left for compileRule is reported at the rule's line.
	if _, err := compileRule(spiffeid.TrustDomain{}, 0, r); err != nil {
		return Rule{}, p.errAt(n, "%w", err)
	}
	return r, nil
}

// templates reads spiffeID and dnsNames, checking each at its line.
func (p *parser) templates(m map[string]*yaml.Node, r *Rule) error {
	var err error
	if r.SPIFFEID, err = p.scalar(m["spiffeID"], "spiffeID"); err != nil {
		return err
	}
	if _, err := parseIDTemplate(r.SPIFFEID); err != nil {
		return p.errAt(m["spiffeID"], "spiffeID: %w", err)
	}
	if m["dnsNames"] == nil {
		return nil
	}
	items, err := p.list(m["dnsNames"], "dnsNames")
	if err != nil {
		return err
	}
	if len(items) > MaxDNSNames {
		return p.errAt(m["dnsNames"], "dnsNames: %d names, more than %d", len(items), MaxDNSNames)
	}
	for i, item := range items {
		where := fmt.Sprintf("dnsNames[%d]", i)
		s, err := p.scalar(item, where)
		if err != nil {
			return err
		}
		if _, err := parseDNSTemplate(s); err != nil {
			return p.errAt(item, "%s: %w", where, err)
		}
		r.DNSNames = append(r.DNSNames, s)
	}
	return nil
}

func (p *parser) ttl(n *yaml.Node) (time.Duration, error) {
	s, err := p.scalar(n, "ttl")
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, p.errAt(n, "ttl %q: want a positive Go duration such as 1h or 30m", s)
	}
	if err := checkTTL(d, 0); err != nil {
		return 0, p.errAt(n, "%w", err)
	}
	return d, nil
}

func (p *parser) selectors(n *yaml.Node) ([]Selector, error) {
	items, err := p.list(n, "workloads")
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, p.errAt(n, "workloads: empty; a rule must select workloads (`- kubernetes: true` selects every Kubernetes workload)")
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
	if v := m["kubernetes"]; v != nil {
		if v.ShortTag() != "!!bool" || v.Value != "true" {
			return Selector{}, p.errAt(v, "%s.kubernetes must be true (omit it otherwise), got %s", where, yamlcheck.Describe(v))
		}
		s.Kubernetes = true
	}
	for _, f := range []struct {
		key string
		dst *string
	}{{"namespace", &s.Namespace}, {"serviceAccount", &s.ServiceAccount}, {"binaryPath", &s.BinaryPath}, {"binarySHA256", &s.BinarySHA256}} {
		if v := m[f.key]; v != nil {
			if *f.dst, err = p.scalar(v, where+"."+f.key); err != nil {
				return Selector{}, err
			}
		}
	}
	if s.UID, err = p.id(m["uid"], where+".uid"); err != nil {
		return Selector{}, err
	}
	if s.GID, err = p.id(m["gid"], where+".gid"); err != nil {
		return Selector{}, err
	}
	if v := m["podLabels"]; v != nil {
		if s.PodLabels, err = p.labelSelector(v, where+".podLabels"); err != nil {
			return Selector{}, err
		}
	}
	if _, err := compileSelector(s); err != nil {
		return Selector{}, p.errAt(n, "%s: %w", where, err)
	}
	return s, nil
}

// id reads a uid or gid: a decimal integer from 0 to 4294967295.
func (p *parser) id(n *yaml.Node, where string) (*uint32, error) {
	if n == nil {
		return nil, nil
	}
	v, err := strconv.ParseUint(n.Value, 10, 32)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || err != nil {
		return nil, p.errAt(n, "%s must be a decimal integer from 0 to %d, got %s", where, uint32(1<<32-1), yamlcheck.Describe(n))
	}
	id := uint32(v)
	return &id, nil
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
	return ls, nil
}

func (p *parser) stringMap(n *yaml.Node, where string) (map[string]string, error) {
	pairs, err := p.pairs(n, where, func(string) bool { return true })
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
	m, err := p.mapping(n, where, expressionKeys)
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
		items, err := p.list(v, where+".values")
		if err != nil {
			return e, err
		}
		for i, item := range items {
			s, err := p.scalar(item, fmt.Sprintf("%s.values[%d]", where, i))
			if err != nil {
				return e, err
			}
			e.Values = append(e.Values, s)
		}
	}
	return e, nil
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

// scalar returns the value of a string scalar. Other scalars are refused
// rather than stringified: "namespace: 1e3" or "app: yes" is more likely
// a mistake than meant.
func (p *parser) scalar(n *yaml.Node, where string) (string, error) {
	if problem := yamlcheck.StringProblem(n); problem != "" {
		return "", p.errAt(n, "%s %s", where, problem)
	}
	return n.Value, nil
}
