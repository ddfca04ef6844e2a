package identitymap

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.yaml.in/yaml/v3"

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
	documentKeys = []string{"default", "rules"}
	ruleKeys     = []string{"name", "workloads", "spiffeID", "ttl", "dnsNames"}
	selectorKeys = []string{"kubernetes", "namespace", "serviceAccount", "podLabels", "uid", "gid", "binaryPath", "binarySHA256"}
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
	root, err := yamlcheck.Decode(data, origin, "identity map")
	if err != nil {
		return Document{}, fmt.Errorf("identitymap: %w", err)
	}
	return ParseNode(root, origin)
}

// ParseNode parses a document already read as YAML (a section of a
// larger configuration file), keeping that file's line numbers. A nil or
// null node is an empty document.
func ParseNode(n *yaml.Node, origin string) (Document, error) {
	p := &parser{yamlcheck.Parser{Origin: origin}}
	doc, err := p.document(n)
	if err != nil {
		return Document{}, fmt.Errorf("identitymap: %w", err)
	}
	return doc, nil
}

type parser struct{ yamlcheck.Parser }

func (p *parser) document(n *yaml.Node) (Document, error) {
	n, err := p.Root(n, "an identity map")
	if n == nil || err != nil {
		return Document{}, err
	}
	m, err := p.Mapping(n, "the identity map", documentKeys)
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
		return nil, p.ErrorAt(n, "rules: %d rules, over the limit of %d", len(items), MaxRules)
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
	for _, k := range []string{"name", "workloads", "spiffeID"} {
		if m[k] == nil {
			return Rule{}, p.ErrorAt(n, "missing required key %q", k)
		}
	}
	r := Rule{Origin: fmt.Sprintf("%s:%d", p.Origin, n.Line)}
	if r.Name, err = p.String(m["name"], "name"); err != nil {
		return Rule{}, err
	}
	if err := checkName(r.Name); err != nil {
		return Rule{}, p.ErrorAt(m["name"], "%w (rule names share the namespace of IdentityMapping resource names)", err)
	}
	p.Within = fmt.Sprintf("rule %d %q", i+1, r.Name)
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
		return Rule{}, p.ErrorAt(n, "%w", err)
	}
	return r, nil
}

// templates reads spiffeID and dnsNames, checking each at its line.
func (p *parser) templates(m map[string]*yaml.Node, r *Rule) error {
	var err error
	if r.SPIFFEID, err = p.String(m["spiffeID"], "spiffeID"); err != nil {
		return err
	}
	if _, err := parseIDTemplate(r.SPIFFEID); err != nil {
		return p.ErrorAt(m["spiffeID"], "spiffeID: %w", err)
	}
	if m["dnsNames"] == nil {
		return nil
	}
	items, err := p.List(m["dnsNames"], "dnsNames")
	if err != nil {
		return err
	}
	if len(items) > MaxDNSNames {
		return p.ErrorAt(m["dnsNames"], "dnsNames: %d names, more than %d", len(items), MaxDNSNames)
	}
	for i, item := range items {
		where := fmt.Sprintf("dnsNames[%d]", i)
		s, err := p.String(item, where)
		if err != nil {
			return err
		}
		if _, err := parseDNSTemplate(s); err != nil {
			return p.ErrorAt(item, "%s: %w", where, err)
		}
		r.DNSNames = append(r.DNSNames, s)
	}
	return nil
}

func (p *parser) ttl(n *yaml.Node) (time.Duration, error) {
	s, err := p.String(n, "ttl")
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, p.ErrorAt(n, "ttl %q: want a positive Go duration such as 1h or 30m", s)
	}
	if err := checkTTL(d, 0); err != nil {
		return 0, p.ErrorAt(n, "%w", err)
	}
	return d, nil
}

func (p *parser) selectors(n *yaml.Node) ([]Selector, error) {
	items, err := p.List(n, "workloads")
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, p.ErrorAt(n, "workloads: empty; a rule must select workloads (`- kubernetes: true` selects every Kubernetes workload)")
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
	if v := m["kubernetes"]; v != nil {
		if v.ShortTag() != "!!bool" || v.Value != "true" {
			return Selector{}, p.ErrorAt(v, "%s.kubernetes must be true (omit it otherwise), got %s", where, yamlcheck.Describe(v))
		}
		s.Kubernetes = true
	}
	for _, f := range []struct {
		key string
		dst *string
	}{{"namespace", &s.Namespace}, {"serviceAccount", &s.ServiceAccount}, {"binaryPath", &s.BinaryPath}, {"binarySHA256", &s.BinarySHA256}} {
		if v := m[f.key]; v != nil {
			if *f.dst, err = p.String(v, where+"."+f.key); err != nil {
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
		if s.PodLabels, err = p.LabelSelector(v, where+".podLabels"); err != nil {
			return Selector{}, err
		}
	}
	if _, err := compileSelector(s); err != nil {
		return Selector{}, p.ErrorAt(n, "%s: %w", where, err)
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
		return nil, p.ErrorAt(n, "%s must be a decimal integer from 0 to %d, got %s", where, uint32(1<<32-1), yamlcheck.Describe(n))
	}
	id := uint32(v)
	return &id, nil
}
