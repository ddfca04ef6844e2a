package audit

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

func TestPolicyFindings(t *testing.T) {
	east := local(root(t, "east.example", testca.Options{}))
	west := peer("west.example", okFed("https://west.example/"), root(t, "west.example", testca.Options{}))
	none := &api.TrustPolicy{Default: "allow"}
	cases := []struct {
		name string
		tds  []api.TrustDomain
		tp   *api.TrustPolicy
		want []found
	}{
		{"server predating policies: not judged", []api.TrustDomain{east, west}, nil, []found{}},
		{"no policy while federating", []api.TrustDomain{east, west}, none,
			[]found{{api.SeverityWarning, CodeNoTrustPolicy, ""}}},
		{"no policy, nothing federated", []api.TrustDomain{east}, none, []found{}},
		{"default deny without rules is a policy", []api.TrustDomain{east, west}, &api.TrustPolicy{Default: "deny"}, []found{}},
		{"a rule", []api.TrustDomain{east, west}, &api.TrustPolicy{Default: "allow", Rules: 1,
			Grants: []api.PolicyGrant{{Rule: "r", Origin: "file:p:3", TrustDomain: "west.example"}}}, []found{}},
		{"a rule granting a trust domain not federated", []api.TrustDomain{east, west}, &api.TrustPolicy{Default: "allow", Rules: 1,
			Grants: []api.PolicyGrant{{Rule: "r", Origin: "file:p:3", TrustDomain: "north.example"}}},
			[]found{{api.SeverityWarning, CodePolicyUnfederate, "north.example"}}},
		{"conflict", []api.TrustDomain{east, west}, &api.TrustPolicy{Default: "allow", Rules: 2, Conflicts: []string{"rule a limits, rule b does not"}},
			[]found{{api.SeverityWarning, CodePolicyConflict, ""}}},
		{"a source refused", []api.TrustDomain{east, west}, &api.TrustPolicy{Default: "deny",
			Sources: []api.PolicySource{{Source: "file:/p", LastError: "line 3: rule \"a\": no workloads"}, {Source: "crd"}}},
			[]found{{api.SeverityWarning, CodePolicyRejected, ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", TrustDomains: tc.tds, TrustPolicy: tc.tp})
			assert.Equal(t, tc.want, summary(fs))
			for _, f := range fs {
				assert.NotEmpty(t, f.Message)
				assert.NotEmpty(t, f.Fix)
			}
		})
	}
	fs := Findings(api.Snapshot{Time: now, TrustDomains: []api.TrustDomain{east, west}, TrustPolicy: none})
	require.Len(t, fs, 1)
	assert.Contains(t, fs[0].Fix, "every workload trusts every federated trust domain; add a trust policy")
	assert.Contains(t, fs[0].Fix, "docs/trust-policy.md")
}

// Policy entries chain and verify like every other, old entries (without
// the policy field) keep their bytes, and an edited rule list breaks the
// chain.
func TestPolicyEntriesChain(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf)
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	require.NoError(t, l.Append(sampleEntries()[0]))
	require.NoError(t, l.Append(Entry{Time: t0, Actor: "a", Event: "trust_policy_changed", Policy: &PolicyChange{
		Source: "file:/etc/p.yaml", Rules: 2, Default: "deny", DigestBefore: "aa", DigestAfter: "bb",
		RulesAdded: []string{"new"}, RulesRemoved: []string{"old"}, RulesChanged: []string{"kept"},
	}}))
	require.NoError(t, l.Append(Entry{Time: t0, Actor: "a", Event: "trust_policy_rejected", Reason: "p.yaml:3: bad",
		Policy: &PolicyChange{Source: "file:/etc/p.yaml", Rules: 2, Default: "deny", DigestBefore: "bb"}}))
	res, err := Verify(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, uint64(3), res.Entries)
	lines := strings.SplitAfter(buf.String(), "\n")
	assert.NotContains(t, lines[0], `"policy"`, "entries without a policy change keep their old bytes")
	assert.Contains(t, lines[1], `"rules_added":["new"]`)

	edited := strings.Replace(buf.String(), `"rules_removed":["old"]`, `"rules_removed":[]`, 1)
	_, err = Verify(strings.NewReader(edited))
	assert.ErrorIs(t, err, ErrBroken)
}

func TestNewPolicyChange(t *testing.T) {
	local := spiffeid.RequireTrustDomainFromString("east.example")
	rule := func(name, origin, td string) trustpolicy.Rule {
		return trustpolicy.Rule{Name: name, Origin: origin,
			Workloads:    []trustpolicy.Selector{{SPIFFEID: "spiffe://east.example/ns/" + name + "/*"}},
			TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: td}}}
	}
	compile := func(def trustpolicy.Default, rules ...trustpolicy.Rule) *trustpolicy.Policy {
		p, err := trustpolicy.Compile(local, def, rules)
		require.NoError(t, err)
		return p
	}
	before := compile(trustpolicy.DefaultAllow, rule("kept", "file:p:2", "west.example"), rule("moved", "file:p:8", "west.example"),
		rule("edited", "file:p:14", "west.example"), rule("gone", "file:p:20", "west.example"))
	after := compile(trustpolicy.DefaultDeny, rule("kept", "file:p:2", "west.example"), rule("moved", "file:p:9", "west.example"),
		rule("edited", "file:p:14", "north.example"), rule("new", "file:p:20", "west.example"))

	c := NewPolicyChange("file:p", before, after)
	assert.Equal(t, "file:p", c.Source)
	assert.Equal(t, 4, c.Rules)
	assert.Equal(t, "deny", c.Default)
	assert.Equal(t, []string{"new"}, c.RulesAdded)
	assert.Equal(t, []string{"gone"}, c.RulesRemoved)
	assert.Equal(t, []string{"edited"}, c.RulesChanged, "a rule that only moved lines is not changed")
	assert.Len(t, c.DigestBefore, 64)
	assert.NotEqual(t, c.DigestBefore, c.DigestAfter)
	assert.Equal(t, c.DigestAfter, compile(trustpolicy.DefaultDeny, after.Rules()...).TextDigest(), "the digest is the text's")

	start := NewPolicyChange("start", nil, compile(trustpolicy.DefaultAllow))
	assert.Equal(t, PolicyChange{Source: "start", Default: "allow"}, start, "no policy: no digest, no rules")
	deny := NewPolicyChange("start", nil, compile(trustpolicy.DefaultDeny))
	assert.NotEmpty(t, deny.DigestAfter, "default deny without rules is a policy")
	assert.Equal(t, "deny", deny.Default)
}

// A change of 10,000 rules (the parser's limit) with the longest names a
// rule may have still fits one audit entry: each name list is cut, the
// counts say how many there were.
func TestPolicyChangeOfManyRulesAppends(t *testing.T) {
	local := spiffeid.RequireTrustDomainFromString("east.example")
	compile := func(prefix string, n int) *trustpolicy.Policy {
		rules := make([]trustpolicy.Rule, n)
		for i := range rules {
			name := fmt.Sprintf("%s-%05d-", prefix, i)
			name += strings.Repeat("x", 253-len(name))
			rules[i] = trustpolicy.Rule{Name: name, Origin: "file:p",
				Workloads:    []trustpolicy.Selector{{Namespace: fmt.Sprintf("ns%d", i)}},
				TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "west.example"}}}
		}
		p, err := trustpolicy.Compile(local, trustpolicy.DefaultAllow, rules)
		require.NoError(t, err)
		return p
	}
	before, after := compile("old", trustpolicy.MaxRules), compile("new", trustpolicy.MaxRules)
	c := NewPolicyChange("file:p", before, after)
	assert.Equal(t, trustpolicy.MaxRules, c.RulesAddedCount)
	assert.Equal(t, trustpolicy.MaxRules, c.RulesRemovedCount)
	assert.Zero(t, c.RulesChangedCount)
	assert.True(t, c.RulesTruncated)
	assert.NotEmpty(t, c.RulesAdded)
	assert.LessOrEqual(t, len(c.RulesAdded), MaxPolicyChangeNames)
	assert.True(t, strings.HasPrefix(c.RulesAdded[0], "new-00000-"), "the first names, sorted")

	var buf bytes.Buffer
	l := New(&buf)
	require.NoError(t, l.Append(Entry{Time: now, Actor: "a", Event: "trust_policy_changed", Policy: &c}))
	res, err := Verify(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), res.Entries)
	assert.Contains(t, buf.String(), `"rules_added_count":10000`)
}

// A small change lists every name and says it is complete.
func TestPolicyChangeCounts(t *testing.T) {
	names := []string{"b", "a"}
	kept, n := capNames(names, new(bool))
	assert.Equal(t, []string{"a", "b"}, kept)
	assert.Equal(t, 2, n)
	truncated := false
	many := make([]string, MaxPolicyChangeNames+1)
	for i := range many {
		many[i] = fmt.Sprintf("r%03d", i)
	}
	kept, n = capNames(many, &truncated)
	assert.Len(t, kept, MaxPolicyChangeNames)
	assert.Equal(t, MaxPolicyChangeNames+1, n)
	assert.True(t, truncated)
}
