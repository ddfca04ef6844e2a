package trustpolicy

import (
	"fmt"
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
	documentKeys = []string{"default", "rules"}
	ruleKeys     = []string{"name", "workloads", "trustDomains"}
	selectorKeys = []string{"spiffeID", "namespace", "labels"}
	grantKeys    = []string{"name", "peers"}
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
	root, err := yamlcheck.Decode(data, origin, "policy")
	if err != nil {
		return Document{}, fmt.Errorf("trustpolicy: %w", err)
	}
	return ParseNode(root, origin)
}

// ParseNode parses a document already read as YAML (the --config file's
// trustPolicy key), keeping that file's line numbers. A nil or null node
// is an empty document.
func ParseNode(n *yaml.Node, origin string) (Document, error) {
	p := &parser{yamlcheck.Parser{Origin: origin}}
	doc, err := p.document(n)
	if err != nil {
		return Document{}, fmt.Errorf("trustpolicy: %w", err)
	}
	return doc, nil
}

type parser struct{ yamlcheck.Parser }

func (p *parser) document(n *yaml.Node) (Document, error) {
	n, err := p.Root(n, "a trust policy")
	if n == nil || err != nil {
		return Document{}, err
	}
	m, err := p.Mapping(n, "the policy", documentKeys)
	if err != nil {
		return Document{}, err
	}
	var doc Document
	if v := m["default"]; v != nil {
		s, err := p.String(v, "default")
		if err != nil {
			return Document{}, err
		}
		if doc.Default, err = ParseDefault(s); err != nil {
			return Document{}, p.ErrorAt(v, "default: %w", err)
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
	items, err := p.List(n, "rules")
	if err != nil {
		return nil, err
	}
	if len(items) > MaxRules {
		return nil, p.ErrorAt(n, "rules: %d rules, over the limit of %d; select workloads by prefix or namespace to need fewer", len(items), MaxRules)
	}
	out := make([]Rule, 0, len(items))
	names := make(map[string]int, len(items))
	for i, item := range items {
		r, err := p.rule(i, item)
		if err != nil {
			return nil, err
		}
		if line, dup := names[r.Name]; dup {
			return nil, p.ErrorAt(item, "rule %d %q: name already used by the rule at line %d", i+1, r.Name, line)
		}
		names[r.Name] = item.Line
		out = append(out, r)
	}
	return out, nil
}

func (p *parser) rule(i int, n *yaml.Node) (Rule, error) {
	p.Within = fmt.Sprintf("rule %d", i+1)
	defer func() { p.Within = "" }()
	m, err := p.Mapping(n, "the rule", ruleKeys)
	if err != nil {
		return Rule{}, err
	}
	r := Rule{Origin: fmt.Sprintf("%s:%d", p.Origin, n.Line)}
	if m["name"] == nil {
		return Rule{}, p.ErrorAt(n, "missing required key \"name\"")
	}
	if r.Name, err = p.String(m["name"], "name"); err != nil {
		return Rule{}, err
	}
	if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 {
		return Rule{}, p.ErrorAt(m["name"], "name %q: %s (rule names share the namespace of ClusterTrustPolicy resource names)", r.Name, strings.Join(errs, "; "))
	}
	p.Within = fmt.Sprintf("rule %d %q", i+1, r.Name)
	if r.Workloads, err = p.selectors(m["workloads"]); err != nil {
		return Rule{}, err
	}
	if r.TrustDomains, err = p.grants(m["trustDomains"]); err != nil {
		return Rule{}, err
	}
	// What is left for compileRule (a missing list, a trust domain listed
	// twice) is reported at the rule's line.
	if _, err := compileRule(spiffeid.TrustDomain{}, r); err != nil {
		return Rule{}, p.ErrorAt(n, "%w", err)
	}
	return r, nil
}

func (p *parser) selectors(n *yaml.Node) ([]Selector, error) {
	items, err := p.List(n, "workloads")
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
	m, err := p.Mapping(n, where, selectorKeys)
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
		if s.Namespace, err = p.String(v, where+".namespace"); err != nil {
			return Selector{}, err
		}
		if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
			return Selector{}, p.ErrorAt(v, "%s.namespace %q: %s", where, s.Namespace, strings.Join(errs, "; "))
		}
	}
	if v := m["labels"]; v != nil {
		if s.Labels, err = p.labelSelector(v, where+".labels"); err != nil {
			return Selector{}, err
		}
	}
	if s.SPIFFEID == "" && s.Namespace == "" && s.Labels == nil {
		return Selector{}, p.ErrorAt(n, "%s: empty selector: set spiffeID, namespace or labels", where)
	}
	return s, nil
}

func (p *parser) pattern(n *yaml.Node, where string) (string, error) {
	s, err := p.String(n, where)
	if err != nil {
		return "", err
	}
	if _, err := ParsePattern(s); err != nil {
		return "", p.ErrorAt(n, "%s: %w", where, err)
	}
	return s, nil
}

// labelSelector is a label selector that selects something, valid as
// Kubernetes checks it.
func (p *parser) labelSelector(n *yaml.Node, where string) (*metav1.LabelSelector, error) {
	ls, err := p.LabelSelector(n, where)
	if err != nil {
		return nil, err
	}
	if len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0 {
		// An empty selector matches everything: say so explicitly.
		return nil, p.ErrorAt(n, "%s: empty label selector; set matchLabels or matchExpressions", where)
	}
	if _, err := metav1.LabelSelectorAsSelector(ls); err != nil {
		return nil, p.ErrorAt(n, "%s: %w", where, err)
	}
	return ls, nil
}

func (p *parser) grants(n *yaml.Node) ([]TrustDomainGrant, error) {
	items, err := p.List(n, "trustDomains")
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
	m, err := p.Mapping(n, where, grantKeys)
	if err != nil {
		return TrustDomainGrant{}, err
	}
	if m["name"] == nil {
		return TrustDomainGrant{}, p.ErrorAt(n, "%s: missing required key \"name\"", where)
	}
	var g TrustDomainGrant
	if g.TrustDomain, err = p.String(m["name"], where+".name"); err != nil {
		return g, err
	}
	if _, err := compileGrant(spiffeid.TrustDomain{}, TrustDomainGrant{TrustDomain: g.TrustDomain}); err != nil {
		return g, p.ErrorAt(m["name"], "%s.name: %w", where, err)
	}
	if m["peers"] == nil {
		return g, nil
	}
	items, err := p.List(m["peers"], where+".peers")
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
			return g, p.ErrorAt(item, "%s: %q is not in trust domain %q", at, s, g.TrustDomain)
		}
		g.Peers = append(g.Peers, s)
	}
	return g, nil
}
