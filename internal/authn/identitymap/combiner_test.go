package identitymap

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
)

func newTestCombiner(t *testing.T, def Default) (*Combiner, *Cell, *prometheus.Registry) {
	t.Helper()
	cell := NewCell(nil)
	reg := prometheus.NewPedanticRegistry()
	c, err := NewCombiner(Config{TrustDomain: localTD, Default: def}, cell, WithRegisterer(reg), WithClock(clocktesting.NewFakeClock(time.Unix(1000, 0))))
	require.NoError(t, err)
	return c, cell, reg
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestCombinerPublishes(t *testing.T) {
	c, cell, reg := newTestCombiner(t, "")
	m, ch := cell.Watch()
	require.NotNil(t, m, "the default alone is published at once")
	id, err := m.Identify(pod("pay", "api", nil))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/pay/sa/api", id.ID.String())

	host := rule("host", "spiffe://{{.TrustDomain}}/host/{{.UID}}", Selector{UID: u32(7)})
	require.NoError(t, c.SetSource("file:a", []Rule{host}))
	assert.True(t, isClosed(ch))
	m, ch = cell.Watch()
	id, err = m.Identify(Workload{Unix: true, UID: 7})
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/host/7", id.ID.String())

	require.NoError(t, c.SetSource("file:a", []Rule{host}))
	assert.False(t, isClosed(ch), "the same rules again wake nobody")

	// A rule name taken by another source is refused; the source keeps
	// its last good rules (none) and the error is in its status.
	err = c.SetSource("crd", []Rule{rule("host", istioTmpl, Selector{Namespace: "x"})})
	require.ErrorContains(t, err, `rule "host" (test:host) and rule "host" (test:host) have the same name`)
	assert.False(t, isClosed(ch))
	st := c.Statuses()
	require.Len(t, st, 2)
	assert.Equal(t, "crd", st[0].Source)
	assert.Contains(t, st[0].LastError, "have the same name")
	assert.Equal(t, Status{Source: "file:a", Rules: 1, LastSuccess: 1000}, st[1])
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.Reloads.WithLabelValues("crd", rulesource.ResultError)))

	// Conflicts across sources show in the combiner and the metric.
	require.NoError(t, c.SetSource("crd", []Rule{rule("host2", "spiffe://{{.TrustDomain}}/other", Selector{UID: u32(7)})}))
	assert.Len(t, c.Conflicts(), 1)
	assert.Len(t, c.ConflictsOf("host2"), 1)
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.conflicts))
	_, err = cell.Load().Identify(Workload{Unix: true, UID: 7})
	assert.ErrorIs(t, err, ErrConflict)

	c.RemoveSource("crd")
	assert.Empty(t, c.Conflicts())
	assert.Len(t, c.Statuses(), 1)
	n, err := testutil.GatherAndCount(reg, "trustbridge_identity_map_rules")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the removed source's series are gone")
}

// A document that says none wins over the combiner's istio: a file
// cannot give identities the configuration withholds, nor the other way.
func TestCombinerStrictestDefault(t *testing.T) {
	c, cell, _ := newTestCombiner(t, "")
	require.NoError(t, c.SetSourceDocument("file:a", Document{Default: DefaultNone}))
	_, err := cell.Load().Identify(pod("pay", "api", nil))
	require.ErrorIs(t, err, ErrNoIdentity)
	assert.Equal(t, DefaultNone, cell.Load().Default())

	require.NoError(t, c.SetSourceDocument("file:a", Document{Default: DefaultIstio}))
	assert.Equal(t, DefaultIstio, cell.Load().Default())

	c2, cell2, _ := newTestCombiner(t, DefaultNone)
	require.NoError(t, c2.SetSourceDocument("file:a", Document{Default: DefaultIstio}))
	assert.Equal(t, DefaultNone, cell2.Load().Default())
}

func TestCombinerErrors(t *testing.T) {
	_, err := NewCombiner(Config{TrustDomain: localTD}, nil)
	assert.ErrorContains(t, err, "without a cell")
	_, err = NewCombiner(Config{}, NewCell(nil))
	assert.ErrorContains(t, err, "no local trust domain")
	c, cell, _ := newTestCombiner(t, "")
	assert.ErrorContains(t, c.SetSource("", nil), "needs a name")
	before := cell.Load()
	err = c.SetSource("file:a", []Rule{rule("a", "spiffe://other.example/x", Selector{Namespace: "a"})})
	assert.ErrorContains(t, err, `rule 1 "a" (test:a): spiffeID: template names trust domain "other.example"`)
	assert.Same(t, before, cell.Load())
	c.SetSourceError("file:a", assert.AnError)
	assert.Equal(t, assert.AnError.Error(), c.Statuses()[0].LastError)
}

func TestNilMap(t *testing.T) {
	var m *Map
	_, err := m.Identify(pod("a", "b", nil))
	assert.ErrorIs(t, err, ErrNoIdentity)
	assert.Equal(t, BecauseNoMatch, m.Explain(Workload{}).Because)
	assert.Nil(t, NewCell(nil).Load())
}
