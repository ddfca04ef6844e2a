package rulesource

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func testMetrics(t *testing.T) *Metrics {
	t.Helper()
	m := &Metrics{
		Reloads:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_reloads_total", Help: "h"}, []string{"source", "result"}),
		Rules:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_rules", Help: "h"}, []string{"source"}),
		LastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_last_success", Help: "h"}, []string{"source"}),
	}
	require.NoError(t, m.Register(prometheus.NewPedanticRegistry()))
	return m
}

func TestSources(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	m := testMetrics(t)
	s := New[string, string](clk, m)

	rules, def := s.Rules("file:a")
	assert.Nil(t, rules)
	assert.Empty(t, def)
	assert.False(t, s.Unchanged("file:a", nil, ""), "a source never loaded is not unchanged")

	in := []string{"r1", "r2"}
	s.Set("file:a", in, "deny")
	in[0] = "changed"
	rules, def = s.Rules("file:a")
	assert.Equal(t, []string{"r1", "r2"}, rules, "Set keeps a copy")
	assert.Equal(t, "deny", def)
	assert.Equal(t, []Status{{Source: "file:a", Rules: 2, LastSuccess: 1000}}, s.Statuses())

	bad := errors.New("rule 2: bad")
	assert.Equal(t, bad, s.Fail("file:a", bad))
	assert.Equal(t, bad, s.Fail("file:a", bad))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Reloads.WithLabelValues("file:a", ResultError)), "a persisting problem counts once")
	rules, _ = s.Rules("file:a")
	assert.Equal(t, []string{"r1", "r2"}, rules, "a failure keeps the last good rules")

	clk.SetTime(time.Unix(2000, 0))
	assert.True(t, s.Unchanged("file:a", []string{"r1", "r2"}, "deny"))
	assert.False(t, s.Unchanged("file:a", []string{"r1", "r2"}, "allow"))
	assert.Equal(t, []Status{{Source: "file:a", Rules: 2, LastSuccess: 2000}}, s.Statuses(), "unchanged clears the error")
	assert.Equal(t, 2.0, testutil.ToFloat64(m.Reloads.WithLabelValues("file:a", ResultSuccess)))
	assert.Equal(t, 2000.0, testutil.ToFloat64(m.LastSuccess.WithLabelValues("file:a")))

	s.Fail("crd", bad)
	assert.Equal(t, []string{"crd", "file:a", "file:b"}, s.Names("file:b"))
	assert.Equal(t, []string{"crd", "file:a"}, s.Names("crd"))
	assert.Equal(t, []Status{{Source: "crd", LastError: "rule 2: bad"}, {Source: "file:a", Rules: 2, LastSuccess: 2000}}, s.Statuses())

	assert.True(t, s.Remove("file:a"))
	assert.False(t, s.Remove("file:a"))
	assert.Equal(t, []string{"crd"}, s.Names(""))
	assert.Equal(t, 0, testutil.CollectAndCount(m.Rules), "a removed source's metrics go with it")
}

func TestNilMetrics(t *testing.T) {
	s := New[int, bool](clocktesting.NewFakePassiveClock(time.Unix(1, 0)), nil)
	s.Set("x", []int{1}, true)
	_ = s.Fail("x", errors.New("e"))
	assert.True(t, s.Remove("x"))
}
