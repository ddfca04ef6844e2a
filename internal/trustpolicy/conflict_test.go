package trustpolicy

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConflictsFoundOnce: a policy is immutable, so its conflicts are
// found on first use and every later call (each /v1/snapshot, each
// ClusterTrustPolicy status) only copies them. Allocations, unlike time,
// say so without a threshold: finding them formats a message per
// conflict.
func TestConflictsFoundOnce(t *testing.T) {
	rules := []Rule{rule("wide", "spiffe://example.org/ns/*", "partner.example")}
	for i := range 50 {
		rules = append(rules, rule(fmt.Sprintf("r%d", i), fmt.Sprintf("spiffe://example.org/ns/n%d/*", i), "partner.example=spiffe://partner.example/api"))
	}
	p, err := Compile(localTD, DefaultAllow, rules)
	require.NoError(t, err)
	require.Len(t, p.Conflicts(), 50)

	assert.LessOrEqual(t, testing.AllocsPerRun(10, func() { p.Conflicts() }), 1.0, "Conflicts copies the list it found")
	assert.LessOrEqual(t, testing.AllocsPerRun(10, func() { p.ConflictsOf("r7") }), 1.0, "ConflictsOf is a lookup")
}

func TestConflictsOf(t *testing.T) {
	p, err := Compile(localTD, DefaultAllow, []Rule{
		rule("a", "spiffe://example.org/ns/pay/*", "partner.example=spiffe://partner.example/api"),
		rule("b", "spiffe://example.org/ns/*", "partner.example"),
		rule("c", "spiffe://example.org/ns/pay/sa/x", "partner.example=spiffe://partner.example/ops/*"),
		rule("d", "spiffe://example.org/ns/web/*", "other.example"),
	})
	require.NoError(t, err)
	pairs := func(cs []Conflict) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Restricting.Name+">"+c.Lifting.Name)
		}
		return out
	}
	assert.Equal(t, []string{"a>b", "c>b"}, pairs(p.Conflicts()))
	assert.Equal(t, []string{"a>b"}, pairs(p.ConflictsOf("a")), "as the restricting rule")
	assert.Equal(t, []string{"a>b", "c>b"}, pairs(p.ConflictsOf("b")), "as the lifting rule")
	assert.Empty(t, p.ConflictsOf("d"))
	assert.Empty(t, p.ConflictsOf("no such rule"))

	p.Conflicts()[0].Message = "changed by a caller"
	assert.NotEqual(t, "changed by a caller", p.Conflicts()[0].Message, "callers get a copy")

	var nilPolicy *Policy
	assert.Nil(t, nilPolicy.ConflictsOf("a"))
}

// TestConflictsCap: past MaxConflicts the list stops, and ConflictsOf
// only indexes what it holds.
func TestConflictsCap(t *testing.T) {
	rules := []Rule{rule("wide", "spiffe://example.org/ns/*", "partner.example")}
	for i := range MaxConflicts + 5 {
		rules = append(rules, rule(fmt.Sprintf("r%d", i), fmt.Sprintf("spiffe://example.org/ns/n%d/*", i), "partner.example=spiffe://partner.example/api"))
	}
	p, err := Compile(localTD, DefaultAllow, rules)
	require.NoError(t, err)
	assert.Len(t, p.Conflicts(), MaxConflicts)
	assert.Len(t, p.ConflictsOf("wide"), MaxConflicts)
	assert.Len(t, p.ConflictsOf("r0"), 1)
	assert.Empty(t, p.ConflictsOf(fmt.Sprintf("r%d", MaxConflicts+4)))
}
