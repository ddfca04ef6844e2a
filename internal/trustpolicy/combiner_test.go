package trustpolicy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

var (
	localTD   = spiffeid.RequireTrustDomainFromString("example.org")
	partnerTD = spiffeid.RequireTrustDomainFromString("partner.example")
	otherTD   = spiffeid.RequireTrustDomainFromString("other.example")
)

// rule is a rule granting tds (each "td" or "td=peer,peer") to workloads
// matching the SPIFFE ID pattern sel.
func rule(name, sel string, tds ...string) Rule {
	r := Rule{Name: name, Origin: "test:" + name, Workloads: []Selector{{SPIFFEID: sel}}}
	for _, td := range tds {
		name, peers, _ := strings.Cut(td, "=")
		g := TrustDomainGrant{TrustDomain: name}
		if peers != "" {
			g.Peers = strings.Split(peers, ",")
		}
		r.TrustDomains = append(r.TrustDomains, g)
	}
	return r
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func newTestCombiner(t *testing.T, def Default) (*Combiner, *Cell, *prometheus.Registry, *clocktesting.FakeClock) {
	t.Helper()
	cell := NewCell(nil)
	reg := prometheus.NewPedanticRegistry()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	c, err := NewCombiner(localTD, def, cell, WithRegisterer(reg), WithClock(clk))
	require.NoError(t, err)
	return c, cell, reg, clk
}

func TestCombinerPublishes(t *testing.T) {
	c, cell, _, _ := newTestCombiner(t, DefaultAllow)
	p, ch := cell.Load()
	assert.Nil(t, p, "no rules and default allow: no policy")
	require.NotNil(t, c.Policy())

	require.NoError(t, c.SetSource("file:a", []Rule{rule("pay", "spiffe://example.org/ns/pay/*", "partner.example")}))
	assert.True(t, isClosed(ch))
	p, ch = cell.Load()
	require.NotNil(t, p)
	_, ok := p.Decide(Subject{ID: spiffeid.RequireFromString("spiffe://example.org/ns/web/sa/x")}).Allows(partnerTD)
	assert.False(t, ok, "partner.example is governed")

	require.NoError(t, c.SetSource("file:a", []Rule{rule("pay", "spiffe://example.org/ns/pay/*", "partner.example")}))
	assert.False(t, isClosed(ch), "the same rules again wake nobody")
	require.NoError(t, c.SetSource("crd", nil))
	assert.False(t, isClosed(ch), "a new source without rules changes nothing and wakes nobody")

	c.RemoveSource("file:a")
	assert.True(t, isClosed(ch))
	p, _ = cell.Load()
	assert.Nil(t, p, "back to no policy")
}

func TestCombinerDefaultDenyAtStart(t *testing.T) {
	_, cell, _, _ := newTestCombiner(t, DefaultDeny)
	p, _ := cell.Load()
	require.NotNil(t, p)
	_, ok := p.Decide(Subject{ID: spiffeid.RequireFromString("spiffe://example.org/a")}).Allows(partnerTD)
	assert.False(t, ok)
}

func TestCombinerKeepsLastGood(t *testing.T) {
	c, cell, reg, clk := newTestCombiner(t, DefaultAllow)
	good := []Rule{rule("pay", "spiffe://example.org/ns/pay/*", "partner.example")}
	require.NoError(t, c.SetSource("file:a", good))
	before, ch := cell.Load()

	clk.Step(time.Minute)
	err := c.SetSource("file:a", []Rule{rule("pay", "spiffe://partner.example/ns/pay/*", "partner.example")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `file:a: rule "pay" (test:pay): workloads[0]: spiffeID "spiffe://partner.example/ns/pay/*" is not in the local trust domain`)
	after, _ := cell.Load()
	assert.Same(t, before, after, "the last good policy stays")
	assert.False(t, isClosed(ch))
	assert.Equal(t, []Status{{Source: "file:a", Rules: 1, LastError: err.Error(), LastSuccess: 1000}}, c.Statuses())

	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.Reloads.WithLabelValues("file:a", "error")))
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.Reloads.WithLabelValues("file:a", "success")))
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.Rules.WithLabelValues("file:a")))
	assert.Equal(t, 1000.0, testutil.ToFloat64(c.metrics.LastSuccess.WithLabelValues("file:a")))

	c.SetSourceError("file:a", errors.New("open a: no such file"))
	assert.Equal(t, "open a: no such file", c.Statuses()[0].LastError)
	after, _ = cell.Load()
	assert.Same(t, before, after)

	require.NoError(t, c.SetSource("file:a", good), "the last good rules again clear the error")
	assert.Equal(t, []Status{{Source: "file:a", Rules: 1, LastSuccess: 1060}}, c.Statuses())
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "two reload series, rules and last success")
}

func TestCombinerNamesUniqueAcrossSources(t *testing.T) {
	c, cell, _, _ := newTestCombiner(t, DefaultAllow)
	require.NoError(t, c.SetSource("file:a", []Rule{rule("pay", "spiffe://example.org/ns/pay/*", "partner.example")}))
	before, _ := cell.Load()
	r := rule("pay", "spiffe://example.org/ns/web/*", "other.example")
	r.Origin = "crd:pay"
	err := c.SetSource("crd", []Rule{r})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `rule "pay" (test:pay) and rule "pay" (crd:pay) have the same name`)
	after, _ := cell.Load()
	assert.Same(t, before, after)
	st := c.Statuses()
	require.Len(t, st, 2)
	assert.Equal(t, "crd", st[0].Source)
	assert.NotEmpty(t, st[0].LastError)
	assert.Equal(t, 0, st[0].Rules)
}

func TestCombinerDefaults(t *testing.T) {
	var published []Publish
	cell := NewCell(nil)
	c, err := NewCombiner(localTD, DefaultAllow, cell, WithPublishHook(func(p Publish) { published = append(published, p) }))
	require.NoError(t, err)
	require.Len(t, published, 1)

	require.NoError(t, c.SetSourceDocument("config:x", Document{Default: DefaultDeny}))
	p, _ := cell.Load()
	require.NotNil(t, p)
	assert.Equal(t, DefaultDeny, p.Default(), "the strictest default wins")

	require.NoError(t, c.SetSourceDocument("file:y", Document{Default: DefaultAllow}))
	p, _ = cell.Load()
	assert.Equal(t, DefaultDeny, p.Default(), "a file cannot widen another source's deny")

	c.RemoveSource("config:x")
	p, _ = cell.Load()
	assert.Nil(t, p)

	require.NoError(t, c.SetDefault(DefaultDeny))
	p, _ = cell.Load()
	assert.Equal(t, DefaultDeny, p.Default())
	require.Error(t, c.SetDefault("maybe"))
	assert.Len(t, published, 5)
	assert.Equal(t, "config:x", published[1].Source)
	assert.Same(t, published[1].Policy, published[2].Previous)
}

func TestConflicts(t *testing.T) {
	tests := []struct {
		name  string
		rules []Rule
		want  []string // "restricting>lifting"
	}{
		{"restriction lifted for overlapping prefix", []Rule{
			rule("a", "spiffe://example.org/ns/pay/*", "partner.example=spiffe://partner.example/api"),
			rule("b", "spiffe://example.org/ns/*", "partner.example"),
		}, []string{"a>b"}},
		{"exact inside prefix", []Rule{
			rule("a", "spiffe://example.org/ns/pay/sa/x", "partner.example=spiffe://partner.example/api"),
			rule("b", "spiffe://example.org/ns/pay/*", "partner.example"),
		}, []string{"a>b"}},
		{"disjoint prefixes", []Rule{
			rule("a", "spiffe://example.org/ns/pay/*", "partner.example=spiffe://partner.example/api"),
			rule("b", "spiffe://example.org/ns/payments/*", "partner.example"),
		}, nil},
		{"other trust domain", []Rule{
			rule("a", "spiffe://example.org/ns/pay/*", "partner.example=spiffe://partner.example/api"),
			rule("b", "spiffe://example.org/ns/pay/*", "other.example"),
		}, nil},
		{"both restricted", []Rule{
			rule("a", "spiffe://example.org/ns/pay/*", "partner.example=spiffe://partner.example/api"),
			rule("b", "spiffe://example.org/ns/pay/*", "partner.example=spiffe://partner.example/ops/*"),
		}, nil},
		{"different namespaces", []Rule{
			{Name: "a", Workloads: []Selector{{Namespace: "pay"}}, TrustDomains: []TrustDomainGrant{{TrustDomain: "partner.example", Peers: []string{"spiffe://partner.example/api"}}}},
			{Name: "b", Workloads: []Selector{{Namespace: "web"}}, TrustDomains: []TrustDomainGrant{{TrustDomain: "partner.example"}}},
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(localTD, DefaultAllow, tt.rules)
			require.NoError(t, err)
			var got []string
			for _, c := range p.Conflicts() {
				got = append(got, c.Restricting.Name+">"+c.Lifting.Name)
				assert.Equal(t, "partner.example", c.TrustDomain)
				assert.Contains(t, c.Message, "accept every member of partner.example")
			}
			assert.Equal(t, tt.want, got)
		})
	}
	var nilPolicy *Policy
	assert.Nil(t, nilPolicy.Conflicts())
}
