package audit

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// policyFindings judges the trust policy of s: none at all while the
// server federates (every workload trusts every peer), conflicting
// rules, rules granting trust domains the server does not federate with
// (they do nothing until it does, then act at once), and sources whose
// last change was refused (the previous rules still hold). A snapshot
// without trust_policy, from a server that predates policies, is not
// judged.
func policyFindings(s api.Snapshot) []api.Finding {
	tp := s.TrustPolicy
	if tp == nil {
		return nil
	}
	var out []api.Finding
	add := func(td, code, msg, fix string) {
		out = append(out, api.Finding{Severity: api.SeverityWarning, Code: code, TrustDomain: td, Message: msg, Fix: fix})
	}
	known := map[string]bool{}
	federated := 0
	for _, td := range s.TrustDomains {
		known[td.Name] = true
		if !td.Local {
			federated++
		}
	}
	if tp.None() && federated > 0 {
		add("", CodeNoTrustPolicy,
			fmt.Sprintf("no trust policy: every workload trusts every federated trust domain (%d)", federated),
			"every workload trusts every federated trust domain; add a trust policy (--trust-policy FILE, the --config file's trustPolicy key, or ClusterTrustPolicy resources): docs/trust-policy.md")
	}
	for _, c := range tp.Conflicts {
		// The message is the server's description of the conflict; a
		// snapshot is untrusted input, and an empty one still makes a
		// finding that says what it is.
		if strings.TrimSpace(c) == "" {
			c = "the trust policy has conflicting rules (the snapshot does not say which)"
		}
		add("", CodePolicyConflict, c,
			"give the rules disjoint workloads, or the same peers: trustbridge policy explain <spiffe-id> shows what one workload receives")
	}
	for _, g := range tp.Grants {
		if !known[g.TrustDomain] {
			add(g.TrustDomain, CodePolicyUnfederate,
				fmt.Sprintf("rule %q (%s) grants %s, which this server does not federate with: it takes effect, unreviewed, the day someone adds that federation", g.Rule, g.Origin, g.TrustDomain),
				fmt.Sprintf("remove %s from the rule, or federate with it deliberately (trustbridge federation add)", g.TrustDomain))
		}
	}
	for _, src := range tp.Sources {
		if src.LastError != "" {
			add("", CodePolicyRejected,
				fmt.Sprintf("trust policy source %s: its last change was refused, the previous rules stay in force: %s", src.Source, src.LastError),
				"fix the source (trustbridge policy check FILE for a file) so the policy in force is the one written down")
		}
	}
	return out
}

// PolicyChange is how the trust policy changed, or what change was
// refused.
type PolicyChange struct {
	// Source is what changed it: "file:<path>", "config:<path>", "crd",
	// "start" (the policy in force when the server started).
	Source string `json:"source"`
	// Rules and Default are the policy in force after the entry.
	Rules   int    `json:"rules"`
	Default string `json:"default"`
	// DigestBefore and DigestAfter are the policies' TextDigest (the policy's
	// text, as /v1/snapshot's trust_policy.text_digest) in force before
	// and after the entry; "" is no policy. A trust_policy_rejected entry
	// changed nothing: both are the digest still in force.
	DigestBefore string `json:"digest_before,omitempty"`
	DigestAfter  string `json:"digest_after,omitempty"`
	// RulesAdded, RulesRemoved and RulesChanged are rule names, sorted,
	// each list cut to its first MaxPolicyChangeNames (and
	// maxPolicyChangeNameBytes) so that the entry fits in MaxLineSize:
	// 10,000 rules, the parser's limit, have names enough for 2.5 MB.
	RulesAdded   []string `json:"rules_added,omitempty"`
	RulesRemoved []string `json:"rules_removed,omitempty"`
	RulesChanged []string `json:"rules_changed,omitempty"`
	// The counts are how many rules each list had before it was cut
	// (0 is left out, so entries written before they existed keep their
	// bytes); RulesTruncated says some list was cut.
	RulesAddedCount   int  `json:"rules_added_count,omitempty"`
	RulesRemovedCount int  `json:"rules_removed_count,omitempty"`
	RulesChangedCount int  `json:"rules_changed_count,omitempty"`
	RulesTruncated    bool `json:"rules_truncated,omitempty"`
}

// MaxPolicyChangeNames caps each rule name list of a PolicyChange; the
// counts say how many there were.
const MaxPolicyChangeNames = 100

// maxPolicyChangeNameBytes caps the names of one list too: a rule name
// may be 253 bytes, and three full lists must leave room in MaxLineSize
// for the rest of the entry.
const maxPolicyChangeNameBytes = 12 << 10

// NewPolicyChange describes how the trust policy went from before to
// after (either may be nil: no policy), for source. Rules are matched by
// name; a rule whose workloads or trust domains differ is changed (one
// that only moved, a new Origin line, is not).
func NewPolicyChange(source string, before, after *trustpolicy.Policy) PolicyChange {
	c := PolicyChange{Source: source, Default: string(trustpolicy.DefaultAllow), DigestBefore: before.TextDigest(), DigestAfter: after.TextDigest()}
	if after != nil {
		c.Rules, c.Default = len(after.Rules()), string(after.Default())
	}
	old := map[string]trustpolicy.Rule{}
	for _, r := range rulesOf(before) {
		old[r.Name] = r
	}
	for _, r := range rulesOf(after) {
		o, ok := old[r.Name]
		switch {
		case !ok:
			c.RulesAdded = append(c.RulesAdded, r.Name)
		case !reflect.DeepEqual(o.Workloads, r.Workloads) || !reflect.DeepEqual(o.TrustDomains, r.TrustDomains):
			c.RulesChanged = append(c.RulesChanged, r.Name)
		}
		delete(old, r.Name)
	}
	for name := range old {
		c.RulesRemoved = append(c.RulesRemoved, name)
	}
	c.RulesAdded, c.RulesAddedCount = capNames(c.RulesAdded, &c.RulesTruncated)
	c.RulesChanged, c.RulesChangedCount = capNames(c.RulesChanged, &c.RulesTruncated)
	c.RulesRemoved, c.RulesRemovedCount = capNames(c.RulesRemoved, &c.RulesTruncated)
	return c
}

// capNames sorts names and keeps the first MaxPolicyChangeNames of them
// within maxPolicyChangeNameBytes, setting *truncated when it drops any;
// n is how many there were.
func capNames(names []string, truncated *bool) (kept []string, n int) {
	slices.Sort(names)
	size := 0
	for i, name := range names {
		size += len(name) + 3 // quotes and comma
		if i == MaxPolicyChangeNames || size > maxPolicyChangeNameBytes {
			*truncated = true
			return names[:i:i], len(names)
		}
	}
	return names, len(names)
}

func rulesOf(p *trustpolicy.Policy) []trustpolicy.Rule {
	if p == nil {
		return nil
	}
	return p.Rules()
}
