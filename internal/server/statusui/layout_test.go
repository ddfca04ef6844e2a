package statusui

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

type box struct{ x, y, w, h float64 }

func (a box) overlaps(b box) bool {
	return a.x < b.x+b.w && b.x < a.x+a.w && a.y < b.y+b.h && b.y < a.y+a.h
}

func TestLayoutGraph(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 12, 40} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := manySnapshot(n)
			g := layoutGraph(s)
			require.Len(t, g.Nodes, n)
			require.Len(t, g.Edges, n)
			assert.Equal(t, layoutGraph(s), g, "layout must be deterministic")
			// The local trust domain is in the middle.
			assert.InDelta(t, g.Width/2, g.Local.X+g.Local.W/2, 0.01)
			assert.InDelta(t, g.Height/2, g.Local.Y+g.Local.H/2, 0.01)
			all := []box{{g.Local.X, g.Local.Y, g.Local.W, g.Local.H}}
			for i, node := range g.Nodes {
				b := box{node.X, node.Y, node.W, node.H}
				assert.GreaterOrEqual(t, b.x, 0.0)
				assert.GreaterOrEqual(t, b.y, 0.0)
				assert.LessOrEqual(t, b.x+b.w, g.Width)
				assert.LessOrEqual(t, b.y+b.h, g.Height)
				for j, other := range all {
					assert.False(t, b.overlaps(other), "node %d overlaps box %d", i, j)
				}
				all = append(all, b)
				assert.LessOrEqual(t, len([]rune(node.Name)), graphNameMax)
				assert.Equal(t, s.TrustDomains[i+1].Name, node.Full)
				e := g.Edges[i]
				assert.Equal(t, node.Class, e.Class)
				assert.Equal(t, s.TrustDomains[i+1].Federation == nil, e.Dashed)
				// Every edge label lies between the local node and its own
				// node, so labels of one column never cross each other.
				assert.Greater(t, e.LabelX, graphMargin+graphNodeW)
				assert.Less(t, e.LabelX, graphWidth-graphMargin-graphNodeW)
				assert.InDelta(t, node.Y+node.H/2, e.LabelY, 20)
			}
			if n == 1 {
				assert.Greater(t, g.Nodes[0].X, g.Local.X, "a single trust domain goes right")
			}
		})
	}
	t.Run("labels", func(t *testing.T) {
		s, _ := realisticSnapshot()
		g := layoutGraph(s)
		got := map[string]string{}
		for i, e := range g.Edges {
			got[g.Nodes[i].Full] = e.Label + "/" + e.Class
		}
		assert.Equal(t, map[string]string{
			"analytics.vendor.example": "https_web/failing", "corp-root.acme.example": "bundle file/static",
			"legacy.acme.example": "https_spiffe/stale", "partner-bank.example": "https_spiffe/ok",
		}, got)
		assert.Equal(t, "trusts 4 other trust domains", g.Local.Sub)
	})
}

func TestLayoutTimeline(t *testing.T) {
	now := fixtureNow
	mk := func(state string, from, until time.Duration) api.Authority {
		nb, na := now.Add(from), now.Add(until)
		return api.Authority{Kind: api.KindX509, SHA256: fp(state + from.String()), Subject: "CN=" + state, State: state, NotBefore: &nb, NotAfter: &na}
	}
	s := api.Snapshot{Time: now, TrustDomain: "a.example", TrustDomains: []api.TrustDomain{
		{Name: "a.example", Local: true, Authorities: []api.Authority{
			mk("active", -100*day, 200*day), mk("prepared", -day, 300*day), mk("retired", -300*day, 60*day),
			mk("retired", -330*day, 20*day), mk("retired", -360*day, 3*day), mk("retired", -400*day, -2*day),
			{Kind: api.KindJWT, SHA256: fp("jwt"), KeyID: "k"},
		}},
		{Name: "b.example", Federation: &api.Federation{State: "ok"}, Authorities: []api.Authority{
			mk("", -5*365*day, 10*365*day), mk("", 10*day, 100*day),
		}},
		{Name: "c.example", Authorities: []api.Authority{{Kind: api.KindJWT, SHA256: fp("c"), KeyID: "c"}}},
	}}
	tl := layoutTimeline(s, now)
	require.Len(t, tl.Bars, 8)
	assert.Len(t, tl.Groups, 2, "a trust domain without X.509 authorities has no group")
	assert.Equal(t, 2, tl.NoValidity)
	var classes []string
	for _, b := range tl.Bars {
		classes = append(classes, b.Class)
		assert.GreaterOrEqual(t, b.X, tlPlotX0)
		assert.LessOrEqual(t, b.X+b.W, tlPlotX1+0.01)
		assert.Contains(t, b.FP, "sha256:")
	}
	assert.Equal(t, []string{"active", "prepared", "retired", "warning", "critical", "expired", "trusted", "trusted"}, classes)
	// The ten-year root is clipped on both sides and says so.
	long := tl.Bars[6]
	assert.True(t, long.ClipLeft)
	assert.True(t, long.ClipRight)
	assert.NotEmpty(t, long.ArrowL)
	assert.NotEmpty(t, long.ArrowR)
	assert.Contains(t, long.End, "until 2036-11-")
	// The future root is not yet valid and has no elapsed part.
	future := tl.Bars[7]
	assert.True(t, future.NotYetValid)
	assert.Zero(t, future.FadedW)
	// Today is where now falls, and the 7- and 30-day bands follow it.
	assert.Greater(t, tl.TodayX, tlPlotX0)
	assert.Less(t, tl.TodayX, tlPlotX1)
	assert.Less(t, tl.TodayX, tl.CritX)
	assert.Less(t, tl.CritX, tl.WarnX)
	active := tl.Bars[0]
	assert.InDelta(t, 100.0/300.0, active.FadedW/active.W, 0.01, "a third of the active root's life has elapsed")
	assert.Equal(t, "expired 2026-11-20 (2d ago)", tl.Bars[5].End)
	assert.Equal(t, "today 2026-11-22", tl.TodayLabel)
	// Rows do not overlap and the SVG holds them all.
	for i := 1; i < len(tl.Bars); i++ {
		assert.GreaterOrEqual(t, tl.Bars[i].Y, tl.Bars[i-1].Y+tlRowH)
	}
	assert.Greater(t, tl.Height, tl.Bars[len(tl.Bars)-1].Y+tlRowH)
	assert.Equal(t, layoutTimeline(s, now), tl)
}

func TestLayoutTimelineEmpty(t *testing.T) {
	tl := layoutTimeline(api.Snapshot{Time: fixtureNow}, fixtureNow)
	assert.True(t, tl.Empty)
	assert.Empty(t, tl.Bars)
	assert.Greater(t, tl.TodayX, tlPlotX0)
	assert.Less(t, tl.TodayX, tlPlotX1)
	assert.NotEmpty(t, tl.Ticks)
}

func TestTicks(t *testing.T) {
	tests := []struct {
		name      string
		span      time.Duration
		wantFirst string
		yearly    bool
	}{
		{"weeks", 60 * day, "Nov 23", false},
		{"months", 300 * day, "Dec 2026", false},
		{"quarters", 700 * day, "Jan 2027", false},
		{"years", 3000 * day, "2027", true},
	}
	lo := fixtureNow
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := ticks(lo, lo.Add(tt.span))
			require.NotEmpty(t, ts)
			assert.LessOrEqual(t, len(ts), 11)
			assert.Equal(t, tt.wantFirst, ts[0].label)
			for i, tk := range ts {
				assert.False(t, tk.at.Before(lo))
				assert.False(t, tk.at.After(lo.Add(tt.span)))
				if i > 0 {
					assert.True(t, tk.at.After(ts[i-1].at))
				}
				assert.Equal(t, tt.yearly, !strings.Contains(tk.label, " "), tk.label)
			}
		})
	}
}
