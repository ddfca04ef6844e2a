package identitymap

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn/idtemplate"
)

// MaxRules caps the rules of one document and of a Map.
const MaxRules = 10000

// maxNamedRules is how many rule names an error lists before "and N more".
const maxNamedRules = 10

// Config is what a Map needs besides its rules.
type Config struct {
	// TrustDomain is the local trust domain, required: every ID is in it.
	TrustDomain spiffeid.TrustDomain
	// Default is what workloads no rule selects get; "" is DefaultIstio.
	Default Default
	// MaxTTL bounds rules' TTLs (the issuer's maximum workload TTL); 0 is
	// DefaultMaxTTL.
	MaxTTL time.Duration
}

// Map is a checked, immutable set of rules for one local trust domain:
// what identity each workload gets.
type Map struct {
	cfg       Config
	rules     []compiledRule
	conflicts conflictSet
}

// Identity is what a workload gets.
type Identity struct {
	ID spiffeid.ID
	// TTL is the X509-SVID lifetime; 0 leaves it to the issuer.
	TTL time.Duration
	// DNSNames are sorted, each once.
	DNSNames []string
	// Rules are the names of the rules that gave it, in map order; nil
	// when it is the default's.
	Rules []string
}

// Compile checks cfg and rules and builds a Map. Errors name the rule and
// its origin.
func Compile(cfg Config, rules []Rule) (*Map, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("identitymap: no local trust domain")
	}
	if cfg.Default == "" {
		cfg.Default = DefaultIstio
	}
	if _, err := ParseDefault(string(cfg.Default)); err != nil {
		return nil, fmt.Errorf("identitymap: %w", err)
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	if len(rules) > MaxRules {
		return nil, fmt.Errorf("identitymap: %d rules, over the limit of %d", len(rules), MaxRules)
	}
	m := &Map{cfg: cfg, rules: make([]compiledRule, 0, len(rules))}
	names := make(map[string]string, len(rules))
	for i, r := range rules {
		cr, err := compileRule(cfg.TrustDomain, cfg.MaxTTL, r)
		if err != nil {
			return nil, fmt.Errorf("identitymap: rule %d %q (%s): %w", i+1, r.Name, r.Origin, err)
		}
		if prev, dup := names[r.Name]; dup {
			return nil, fmt.Errorf("identitymap: rule %d %q (%s): name already used by the rule at %s", i+1, r.Name, r.Origin, prev)
		}
		names[r.Name] = r.Origin
		m.rules = append(m.rules, cr)
	}
	return m, nil
}

// TrustDomain is the local trust domain.
func (m *Map) TrustDomain() spiffeid.TrustDomain { return m.cfg.TrustDomain }

// Default is what workloads no rule selects get.
func (m *Map) Default() Default { return m.cfg.Default }

// Rules returns the rules as given to Compile.
func (m *Map) Rules() []Rule {
	out := make([]Rule, len(m.rules))
	for i, r := range m.rules {
		out[i] = r.Rule
	}
	return out
}

// Identify returns w's identity: that of every rule selecting it, which
// must agree on the SPIFFE ID, or the default's when no rule does. Errors
// wrap ErrNoIdentity, ErrConflict or ErrFacts and say which rules were
// considered, which matched and what to change; a workload is never given
// one of two identities silently.
func (m *Map) Identify(w Workload) (Identity, error) {
	if m == nil {
		return Identity{}, fmt.Errorf("identitymap: %w: no identity map is loaded yet", ErrNoIdentity)
	}
	res := m.evaluate(&w)
	return res.identity, res.err
}

// ruleResult is what one rule that selects a workload makes of it.
type ruleResult struct {
	rule     *compiledRule
	selector int // index of the first selector that matched
	id       spiffeid.ID
	dns      []string
	err      error
}

// result is a whole evaluation, for Identify and Explain.
type result struct {
	matched  []ruleResult
	identity Identity
	err      error
}

func (m *Map) evaluate(w *Workload) result {
	var res result
	for i := range m.rules {
		r := &m.rules[i]
		if j := slices.IndexFunc(r.selectors, func(s compiledSelector) bool { return s.matches(w) }); j >= 0 {
			res.matched = append(res.matched, r.evaluate(m.cfg.TrustDomain, w, j))
		}
	}
	if len(res.matched) == 0 {
		res.identity, res.err = m.fallback(w)
	} else {
		res.identity, res.err = merge(w, res.matched)
	}
	if res.err != nil {
		res.identity = Identity{}
	}
	return res
}

// evaluate fills the rule's templates from w, selected by selector i.
func (r *compiledRule) evaluate(td spiffeid.TrustDomain, w *Workload, i int) ruleResult {
	rr := ruleResult{rule: r, selector: i}
	if rr.id, rr.err = r.id.id(td, w); rr.err != nil {
		rr.err = fmt.Errorf("spiffeID %s", rr.err)
		return rr
	}
	for k, t := range r.dns {
		name, err := t.dnsName(td, w)
		if err != nil {
			rr.err = fmt.Errorf("dnsNames[%d] %s", k, err)
			return rr
		}
		rr.dns = append(rr.dns, name)
	}
	return rr
}

// merge is the identity the matching rules agree on. A rule that cannot
// fill its templates fails the whole workload: skipping it could change
// which identity is issued when a label is removed. Equal IDs merge:
// every rule's DNS names (each rule's operator allowed them for this
// workload) and the shortest TTL set.
func merge(w *Workload, matched []ruleResult) (Identity, error) {
	for _, rr := range matched {
		if rr.err != nil {
			return Identity{}, fmt.Errorf("identitymap: %w: rule %q (%s) selects %s, but its %v", ErrFacts, rr.rule.Name, rr.rule.Origin, w.describe(), rr.err)
		}
	}
	first := matched[0]
	out := Identity{ID: first.id}
	for _, rr := range matched {
		if rr.id != first.id {
			return Identity{}, fmt.Errorf("identitymap: %w: rule %q (%s) gives %s and rule %q (%s) gives %s to %s; make their selectors disjoint or their templates equal",
				ErrConflict, first.rule.Name, first.rule.Origin, first.id, rr.rule.Name, rr.rule.Origin, rr.id, w.describe())
		}
		out.Rules = append(out.Rules, rr.rule.Name)
		out.DNSNames = append(out.DNSNames, rr.dns...)
		if ttl := rr.rule.TTL; ttl > 0 && (out.TTL == 0 || ttl < out.TTL) {
			out.TTL = ttl
		}
	}
	slices.Sort(out.DNSNames)
	out.DNSNames = slices.Compact(out.DNSNames)
	if len(out.DNSNames) > MaxIdentityDNSNames {
		return Identity{}, fmt.Errorf("identitymap: %w: %s give %s %d DNS names, more than the %d one certificate carries; give it fewer dnsNames or make their selectors disjoint",
			ErrFacts, matchedText(matched), w.describe(), len(out.DNSNames), MaxIdentityDNSNames)
	}
	return out, nil
}

// matchedText names the rules that matched, as errors do: rule "a" (origin),
// or rules "a" (origin), "b" (origin), at most maxNamedRules of them.
func matchedText(matched []ruleResult) string {
	parts := make([]string, 0, min(len(matched), maxNamedRules))
	for _, rr := range matched[:min(len(matched), maxNamedRules)] {
		parts = append(parts, fmt.Sprintf("%q (%s)", rr.rule.Name, rr.rule.Origin))
	}
	list := strings.Join(parts, ", ")
	if more := len(matched) - len(parts); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	if len(matched) == 1 {
		return "rule " + list
	}
	return "rules " + list
}

// fallback is the default's identity for a workload no rule selects.
func (m *Map) fallback(w *Workload) (Identity, error) {
	var why string
	switch {
	case m.cfg.Default == DefaultNone:
		why = fmt.Sprintf("the default is %q (every identity comes from a rule): add a rule selecting it", DefaultNone)
	case !w.Kubernetes:
		why = fmt.Sprintf("the default (%q) gives identities to Kubernetes workloads only: give it one with a rule selecting its uid or binaryPath", DefaultIstio)
	case w.Namespace == "" || w.ServiceAccount == "":
		why = fmt.Sprintf("the default (%q) needs its namespace and service account, which were not attested (is its pod known to the agent?)", DefaultIstio)
	}
	if why != "" {
		return Identity{}, fmt.Errorf("identitymap: %w: %s for %s, and %s", ErrNoIdentity, m.noRuleText(), w.describe(), why)
	}
	for _, v := range []string{w.Namespace, w.ServiceAccount} {
		if err := idtemplate.CheckSegment(v); err != nil {
			return Identity{}, fmt.Errorf("identitymap: %w: the default (%q) for %s: %v", ErrFacts, DefaultIstio, w.describe(), err)
		}
	}
	id, err := spiffeid.FromSegments(m.cfg.TrustDomain, "ns", w.Namespace, "sa", w.ServiceAccount)
	if err != nil {
		return Identity{}, fmt.Errorf("identitymap: %w: the default (%q) for %s: %v", ErrFacts, DefaultIstio, w.describe(), err)
	}
	return Identity{ID: id}, nil
}

// noRuleText says which rules were considered: "no rule is configured",
// "none of the 2 rules (a, b) selects it".
func (m *Map) noRuleText() string {
	if len(m.rules) == 0 {
		return "no rule is configured"
	}
	names := make([]string, 0, min(len(m.rules), maxNamedRules))
	for _, r := range m.rules[:min(len(m.rules), maxNamedRules)] {
		names = append(names, r.Name)
	}
	list := strings.Join(names, ", ")
	if more := len(m.rules) - len(names); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	if len(m.rules) == 1 {
		return fmt.Sprintf("the one rule (%s) does not select it", list)
	}
	return fmt.Sprintf("none of the %d rules (%s) selects it", len(m.rules), list)
}
