package trustpolicy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Default is what a workload receives of a trust domain no rule mentions.
type Default string

const (
	// DefaultAllow trusts every federated trust domain no rule governs:
	// trustbridge's behaviour before trust policies, and the default.
	DefaultAllow Default = "allow"
	// DefaultDeny trusts only the local trust domain until a rule grants more.
	DefaultDeny Default = "deny"
)

// ParseDefault parses "allow" or "deny".
func ParseDefault(s string) (Default, error) {
	switch d := Default(s); d {
	case DefaultAllow, DefaultDeny:
		return d, nil
	}
	return "", fmt.Errorf("trust policy default %q: want %q or %q", s, DefaultAllow, DefaultDeny)
}

// Rule grants the workloads it selects trust in some federated trust
// domains, and optionally only in some peers of each. A trust domain named
// by any rule is governed: a workload trusts it only if a rule that
// selects the workload grants it. Rules add up; none takes anything away.
type Rule struct {
	// Name identifies the rule in decisions, errors and the audit log.
	Name string
	// Origin says where the rule was written: "file:<path>:<line>",
	// "config:<path>:<line>" or "crd:<resource name>".
	Origin string
	// Workloads selects local workloads; a workload matching any
	// selector is selected.
	Workloads []Selector
	// TrustDomains are granted to the selected workloads.
	TrustDomains []TrustDomainGrant
	// GovernOnly makes a rule that selects no workload and grants
	// nothing, but keeps its trust domains governed (their peers are not
	// read): what stands for a rule that cannot be applied (a
	// ClusterTrustPolicy that is invalid with no valid generation to keep),
	// so that its trust domains do not fall to the default and widen to
	// every workload. Parse never sets it.
	GovernOnly bool
}

// Selector selects local workloads. Every field that is set must match.
type Selector struct {
	// SPIFFEID is a Pattern of the local trust domain.
	SPIFFEID string
	// Namespace matches the Kubernetes namespace of the service account
	// the workload proved (a service account token, or an X509-SVID
	// issued on one); it never matches other workloads.
	Namespace string
	// Labels is a Kubernetes label selector on that service account's
	// labels (nil: not checked).
	Labels *metav1.LabelSelector
}

// TrustDomainGrant grants one federated trust domain.
type TrustDomainGrant struct {
	TrustDomain string
	// Peers, when not empty, are the only peers of the trust domain the
	// workloads may accept: Patterns of that trust domain.
	Peers []string
}

// Subject is a local workload as the server authenticated it.
type Subject struct {
	ID spiffeid.ID
	// Namespace and ServiceAccount are set when the workload proved a
	// Kubernetes service account.
	Namespace, ServiceAccount string
	// Labels are that service account's labels; nil when unknown.
	Labels map[string]string
}

// Policy is a checked, immutable set of rules for one local trust domain.
type Policy struct {
	local    spiffeid.TrustDomain
	def      Default
	rules    []compiledRule
	index    ruleIndex
	governed map[spiffeid.TrustDomain]bool
	// usesLabels says some selector reads labels: only then do decisions
	// depend on them.
	usesLabels bool
	// digest is Digest's: see there.
	digest    string
	conflicts conflictSet
}

type compiledRule struct {
	Rule
	selectors []compiledSelector
	grants    []Grant
}

type compiledSelector struct {
	id        *Pattern
	namespace string
	labels    labels.Selector // nil: not checked
}

// Compile checks rules and builds a Policy. Errors name the rule and its
// origin. A nil or empty rules with DefaultAllow is "no policy": every
// workload trusts every trust domain.
func Compile(local spiffeid.TrustDomain, def Default, rules []Rule) (*Policy, error) {
	if local.IsZero() {
		return nil, errors.New("trustpolicy: no local trust domain")
	}
	if _, err := ParseDefault(string(def)); err != nil {
		return nil, fmt.Errorf("trustpolicy: %w", err)
	}
	p := &Policy{local: local, def: def, governed: make(map[spiffeid.TrustDomain]bool)}
	names := make(map[string]string, len(rules))
	for i, r := range rules {
		cr, err := compileRule(local, r)
		if err != nil {
			return nil, fmt.Errorf("trustpolicy: rule %d %q (%s): %w", i+1, r.Name, r.Origin, err)
		}
		if prev, dup := names[r.Name]; dup {
			return nil, fmt.Errorf("trustpolicy: rule %d %q (%s): name already used by the rule at %s", i+1, r.Name, r.Origin, prev)
		}
		names[r.Name] = r.Origin
		for _, g := range cr.grants {
			p.governed[g.TrustDomain] = true
		}
		p.usesLabels = p.usesLabels || slices.ContainsFunc(cr.selectors, func(s compiledSelector) bool { return s.labels != nil })
		p.rules = append(p.rules, cr)
	}
	p.index = newRuleIndex(p.rules)
	p.digest = p.computeDigest()
	return p, nil
}

// compileRule checks one rule. With a zero local trust domain (Parse, which
// does not know it) the checks that need it are left to Compile.
func compileRule(local spiffeid.TrustDomain, r Rule) (compiledRule, error) {
	cr := compiledRule{Rule: r}
	if r.Name == "" {
		return cr, errors.New("no name")
	}
	if r.GovernOnly {
		return compileGovernOnly(local, cr)
	}
	if len(r.Workloads) == 0 {
		return cr, errors.New("no workloads: a rule must select at least one workload")
	}
	if len(r.TrustDomains) == 0 {
		return cr, errors.New("no trustDomains: a rule must grant at least one federated trust domain")
	}
	for i, s := range r.Workloads {
		cs, err := compileSelector(local, s)
		if err != nil {
			return cr, fmt.Errorf("workloads[%d]: %w", i, err)
		}
		cr.selectors = append(cr.selectors, cs)
	}
	seen := make(map[spiffeid.TrustDomain]bool)
	for i, g := range r.TrustDomains {
		cg, err := compileGrant(local, g)
		if err != nil {
			return cr, fmt.Errorf("trustDomains[%d]: %w", i, err)
		}
		if seen[cg.TrustDomain] {
			return cr, fmt.Errorf("trustDomains[%d]: trust domain %q is listed twice; merge its peers into one entry", i, g.TrustDomain)
		}
		seen[cg.TrustDomain] = true
		cg.Rules = []string{r.Name}
		cr.grants = append(cr.grants, cg)
	}
	return cr, nil
}

// compileGovernOnly keeps the trust domains of a GovernOnly rule, with no
// selectors: it never matches, so it grants nothing.
func compileGovernOnly(local spiffeid.TrustDomain, cr compiledRule) (compiledRule, error) {
	if len(cr.Workloads) > 0 {
		return cr, errors.New("a governOnly rule selects no workloads")
	}
	for i, g := range cr.TrustDomains {
		cg, err := compileGrant(local, TrustDomainGrant{TrustDomain: g.TrustDomain})
		if err != nil {
			return cr, fmt.Errorf("trustDomains[%d]: %w", i, err)
		}
		cg.Rules = []string{cr.Name}
		cr.grants = append(cr.grants, cg)
	}
	return cr, nil
}

// GovernOnlyRule is the GovernOnly stand-in, named name from origin, of
// a rule that cannot be applied: the trust domains of tds that are valid
// federated trust domains, each once; nil when none is.
func GovernOnlyRule(name, origin string, local spiffeid.TrustDomain, tds []string) *Rule {
	r := Rule{Name: name, Origin: origin, GovernOnly: true}
	for _, td := range tds {
		if _, err := compileGrant(local, TrustDomainGrant{TrustDomain: td}); err != nil ||
			slices.ContainsFunc(r.TrustDomains, func(g TrustDomainGrant) bool { return g.TrustDomain == td }) {
			continue
		}
		r.TrustDomains = append(r.TrustDomains, TrustDomainGrant{TrustDomain: td})
	}
	if len(r.TrustDomains) == 0 {
		return nil
	}
	return &r
}

func compileSelector(local spiffeid.TrustDomain, s Selector) (compiledSelector, error) {
	var cs compiledSelector
	if s.SPIFFEID == "" && s.Namespace == "" && s.Labels == nil {
		return cs, errors.New("empty selector: set spiffeID, namespace or labels")
	}
	if s.SPIFFEID != "" {
		p, err := ParsePattern(s.SPIFFEID)
		if err != nil {
			return cs, err
		}
		if !local.IsZero() && p.TrustDomain() != local {
			return cs, fmt.Errorf("spiffeID %q is not in the local trust domain %q: rules select local workloads", s.SPIFFEID, local.Name())
		}
		cs.id = &p
	}
	cs.namespace = s.Namespace
	if s.Labels != nil {
		// An empty selector would select every service account whose
		// labels are known: too broad to be what anyone meant.
		if len(s.Labels.MatchLabels) == 0 && len(s.Labels.MatchExpressions) == 0 {
			return cs, errors.New("labels: empty label selector; set matchLabels or matchExpressions")
		}
		sel, err := metav1.LabelSelectorAsSelector(s.Labels)
		if err != nil {
			return cs, fmt.Errorf("labels: %w", err)
		}
		cs.labels = sel
	}
	return cs, nil
}

func compileGrant(local spiffeid.TrustDomain, g TrustDomainGrant) (Grant, error) {
	td, err := spiffeid.TrustDomainFromString(g.TrustDomain)
	if err != nil || td.Name() != g.TrustDomain {
		return Grant{}, fmt.Errorf("trust domain %q: want a trust domain name such as partner.example (no spiffe:// prefix, lower case)", g.TrustDomain)
	}
	if !local.IsZero() && td == local {
		return Grant{}, fmt.Errorf("trust domain %q is the local one, which every workload trusts; rules grant federated trust domains", g.TrustDomain)
	}
	out := Grant{TrustDomain: td}
	for i, s := range g.Peers {
		p, err := ParsePattern(s)
		if err != nil {
			return Grant{}, fmt.Errorf("peers[%d]: %w", i, err)
		}
		if p.TrustDomain() != td {
			return Grant{}, fmt.Errorf("peers[%d]: %q is not in trust domain %q", i, s, g.TrustDomain)
		}
		out.Peers = append(out.Peers, p)
	}
	return out, nil
}

func (s compiledSelector) matches(sub Subject) bool {
	if s.id != nil && !s.id.Matches(sub.ID) {
		return false
	}
	if s.namespace != "" && (sub.Namespace == "" || sub.Namespace != s.namespace) {
		return false
	}
	if s.labels != nil && (sub.Labels == nil || !s.labels.Matches(labels.Set(sub.Labels))) {
		return false
	}
	return true
}

// Default is what ungoverned trust domains get.
func (p *Policy) Default() Default { return p.def }

// Rules returns the rules as given to Compile.
func (p *Policy) Rules() []Rule {
	out := make([]Rule, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.Rule
	}
	return out
}

// UsesLabels reports whether any selector reads service account labels
// (false for nil, no policy).
func (p *Policy) UsesLabels() bool { return p != nil && p.usesLabels }

// Empty reports whether the policy has no rules.
func (p *Policy) Empty() bool { return len(p.rules) == 0 }

// Governed reports whether a rule names td.
func (p *Policy) Governed(td spiffeid.TrustDomain) bool { return p.governed[td] }

// Digest covers what Decision.Allows reads besides a subject's grants:
// the local trust domain, the default and the governed trust domains.
// Decision keys derive from it, so two decisions with equal grants under
// policies that differ there differ in key. It does not identify the
// rules (policies with other selectors or peers may share it): the
// audit log's digest of the policy text does.
func (p *Policy) Digest() string { return p.digest }

// TextDigest identifies the policy's text: its default and every rule
// with its origin (SHA-256, hex, of their JSON); "" for a nil policy or one
// without rules under the default allow, which is no policy. The audit
// log's digest_before and digest_after and the snapshot's text_digest
// are this digest, so entries can be matched to the policy shown.
func (p *Policy) TextDigest() string {
	if p == nil || p.Empty() && p.Default() == DefaultAllow {
		return ""
	}
	b, err := json.Marshal(struct {
		Default Default
		Rules   []Rule
	}{p.Default(), p.Rules()})
	if err != nil { // plain strings and maps: cannot fail
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Decide returns what sub may trust.
func (p *Policy) Decide(sub Subject) Decision {
	d := Decision{policy: p}
	byTD := make(map[spiffeid.TrustDomain]int)
	for _, m := range p.matches(sub) {
		r := &p.rules[m.rule]
		d.Matched = append(d.Matched, Match{Rule: r.Name, Origin: r.Origin, Selector: m.sel})
		for _, g := range r.grants {
			i, ok := byTD[g.TrustDomain]
			if !ok {
				byTD[g.TrustDomain] = len(d.Grants)
				d.Grants = append(d.Grants, Grant{TrustDomain: g.TrustDomain, Peers: slices.Clone(g.Peers), Rules: []string{r.Name}})
				continue
			}
			d.Grants[i] = d.Grants[i].merge(g, r.Name)
		}
	}
	slices.SortFunc(d.Grants, func(a, b Grant) int { return cmp.Compare(a.TrustDomain.Name(), b.TrustDomain.Name()) })
	d.key = d.computeKey()
	return d
}

// Match is one rule that selected a subject.
type Match struct {
	Rule   string `json:"rule"`
	Origin string `json:"origin"`
	// Selector is the index of the first of the rule's workload selectors
	// that matched.
	Selector int `json:"selector"`
}

// Grant is one governed trust domain a subject may trust.
type Grant struct {
	TrustDomain spiffeid.TrustDomain
	// Peers are the only peers accepted; empty means every member.
	Peers []Pattern
	// Rules are the names of the rules that granted it.
	Rules []string
}

// merge adds what rule granted: any grant without peers lifts the
// restriction.
func (g Grant) merge(o Grant, rule string) Grant {
	out := Grant{TrustDomain: g.TrustDomain, Rules: append(slices.Clone(g.Rules), rule)}
	if len(g.Peers) > 0 && len(o.Peers) > 0 {
		out.Peers = append(slices.Clone(g.Peers), o.Peers...)
		slices.SortFunc(out.Peers, func(a, b Pattern) int { return cmp.Compare(a.text, b.text) })
		out.Peers = slices.CompactFunc(out.Peers, func(a, b Pattern) bool { return a.text == b.text })
	}
	return out
}

// Decision is what one subject may trust under one Policy.
type Decision struct {
	policy *Policy
	// Matched are the rules that selected the subject, in policy order.
	Matched []Match
	// Grants are the governed trust domains granted, sorted by name.
	Grants []Grant
	key    string
}

// Allows says whether the subject trusts td and, for a governed trust
// domain, the grant (with its peers). The local trust domain is always
// allowed. An ungoverned trust domain is allowed under DefaultAllow.
func (d Decision) Allows(td spiffeid.TrustDomain) (Grant, bool) {
	if d.policy == nil || td == d.policy.local {
		return Grant{TrustDomain: td}, true
	}
	if i := slices.IndexFunc(d.Grants, func(g Grant) bool { return g.TrustDomain == td }); i >= 0 {
		return d.Grants[i], true
	}
	if d.policy.governed[td] {
		return Grant{}, false
	}
	return Grant{TrustDomain: td}, d.policy.def == DefaultAllow
}

// Governs reports whether a rule of the decision's policy names td.
func (d Decision) Governs(td spiffeid.TrustDomain) bool {
	return d.policy != nil && d.policy.governed[td]
}

// Key identifies the decision's effect: two decisions with equal keys
// hand out the same trust from the same bundles. The zero Decision
// (no policy) has key "".
func (d Decision) Key() string { return d.key }

func (d Decision) computeKey() string {
	var b strings.Builder
	b.WriteString(d.policy.digest)
	for _, g := range d.Grants {
		fmt.Fprintf(&b, "|%s", g.TrustDomain.Name())
		for _, p := range g.Peers {
			fmt.Fprintf(&b, ",%s", p.text)
		}
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:12])
}

// computeDigest covers what Allows reads besides the grants: the local
// trust domain, the default and the governed set.
func (p *Policy) computeDigest() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s|%s", p.local.Name(), p.def)
	govd := make([]string, 0, len(p.governed))
	for td := range p.governed {
		govd = append(govd, td.Name())
	}
	slices.Sort(govd)
	for _, n := range govd {
		fmt.Fprintf(h, "|%s", n)
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}
