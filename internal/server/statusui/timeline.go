package statusui

import (
	"fmt"
	"strconv"
	"time"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Timeline geometry, in SVG user units.
const (
	tlWidth    = 1200.0
	tlPlotX0   = 360.0
	tlPlotX1   = 1180.0
	tlTop      = 40.0 // room for tick labels and the today label
	tlGroupH   = 30.0
	tlRowH     = 34.0
	tlBarH     = 16.0
	tlBottom   = 12.0
	tlEndRoom  = 170.0 // width an end label needs beside its bar
	tlLabelMax = 42
	tlGroupMax = 30
	day        = 24 * time.Hour
	// The window shows at most a year back and two ahead: what expires
	// soon matters, a ten-year root would squash everything else.
	tlMaxPast   = 365 * day
	tlMaxFuture = 2 * 365 * day
	tlMinPast   = 14 * day
	tlMinFuture = 60 * day
)

type timeline struct {
	Width, Height  float64
	PlotX0, PlotX1 float64
	Top, Bottom    float64
	Ticks          []tick
	// Today is the snapshot time's x; Warn and Crit are the ends of the
	// 30- and 7-day bands after it.
	TodayX, WarnX, CritX float64
	TodayLabel           string
	Groups               []tlGroup
	Bars                 []tlBar
	// NoValidity counts authorities without a validity period (JWT and
	// WIT keys), listed in the authority table instead.
	NoValidity int
	Empty      bool
}

type tick struct {
	X     float64
	Label string
}

type tlGroup struct {
	Y          float64
	Name       string
	State      string
	StateClass string
	Line       float64 // y of the separator above it
}

type tlBar struct {
	Y              float64 // row top
	BarY           float64
	X, W           float64
	Class          string
	Name           string
	FP, State      string
	LabelY, SubY   float64
	End            string
	EndX, EndY     float64
	EndAnchor      string
	EndInside      bool
	ClipLeft       bool
	ClipRight      bool
	ArrowL, ArrowR string
	Title          string
	FadedW         float64 // elapsed part, drawn lighter
	NotYetValid    bool
	// Degraded marks a federated trust domain whose endpoint is failing
	// or stale: the bar is the last good bundle's, drawn hatched.
	Degraded bool
}

// layoutTimeline lays out the validity timeline of the snapshot's X.509
// authorities, one group of bars per trust domain, as seen at now.
func layoutTimeline(s api.Snapshot, now time.Time) timeline {
	tl := timeline{Width: tlWidth, PlotX0: tlPlotX0, PlotX1: tlPlotX1, Top: tlTop}
	var sc tlScale
	sc, tl.NoValidity = timelineScale(s, now)
	tl.TodayX = sc.x(now)
	tl.WarnX = clampPlotX(sc.x(now.Add(expiryWarning)))
	tl.CritX = clampPlotX(sc.x(now.Add(expiryCritical)))
	tl.TodayLabel = "today " + now.Format("2006-01-02")
	for _, t := range ticks(sc.lo, sc.hi) {
		tl.Ticks = append(tl.Ticks, tick{X: sc.x(t.at), Label: t.label})
	}

	y := tlTop
	for _, td := range s.TrustDomains {
		x509 := withValidity(td.Authorities)
		if len(x509) == 0 {
			continue
		}
		state, class := tdState(td)
		tl.Groups = append(tl.Groups, tlGroup{Y: y + tlGroupH/2 + 5, Name: truncate(td.Name, tlGroupMax), State: state, StateClass: class, Line: y})
		y += tlGroupH
		for _, a := range x509 {
			tl.Bars = append(tl.Bars, layoutBar(td, a, y, sc, tl.TodayX, now))
			y += tlRowH
		}
	}
	tl.Empty = len(tl.Bars) == 0
	if tl.Empty {
		y += 40
	}
	tl.Bottom = y + 4
	tl.Height = y + tlBottom
	return tl
}

// tlScale maps times in the window [lo, hi] onto the plot's x axis.
type tlScale struct {
	lo, hi time.Time
}

// x is t's position on the plot; times outside the window fall outside
// [tlPlotX0, tlPlotX1].
func (sc tlScale) x(t time.Time) float64 {
	f := float64(t.Sub(sc.lo)) / float64(sc.hi.Sub(sc.lo))
	return tlPlotX0 + f*(tlPlotX1-tlPlotX0)
}

// clampPlotX keeps an x inside the plot.
func clampPlotX(v float64) float64 { return min(max(v, tlPlotX0), tlPlotX1) }

// timelineScale picks the window: every validity period, clamped around
// now and padded a little on both sides. It also counts the authorities
// without a validity period, which the timeline cannot show.
func timelineScale(s api.Snapshot, now time.Time) (sc tlScale, noValidity int) {
	var lo, hi time.Time
	for _, td := range s.TrustDomains {
		for _, a := range td.Authorities {
			if a.NotBefore == nil || a.NotAfter == nil {
				noValidity++
				continue
			}
			if lo.IsZero() || a.NotBefore.Before(lo) {
				lo = *a.NotBefore
			}
			if hi.IsZero() || a.NotAfter.After(hi) {
				hi = *a.NotAfter
			}
		}
	}
	if lo.IsZero() {
		lo, hi = now, now
	}
	lo = later(earlier(lo, now.Add(-tlMinPast)), now.Add(-tlMaxPast))
	hi = earlier(later(hi, now.Add(tlMinFuture)), now.Add(tlMaxFuture))
	pad := hi.Sub(lo) / 40
	return tlScale{lo: lo.Add(-pad), hi: hi.Add(pad)}, noValidity
}

// withValidity returns the authorities that have a validity period (the
// X.509 ones), in order.
func withValidity(all []api.Authority) []api.Authority {
	var out []api.Authority
	for _, a := range all {
		// A revoked authority is no longer trusted: no bar.
		if a.NotBefore != nil && a.NotAfter != nil && a.State != stateRevoked {
			out = append(out, a)
		}
	}
	return out
}

// layoutBar lays out the validity bar of authority a of td in the row
// whose top is y; todayX is the snapshot time's x.
func layoutBar(td api.TrustDomain, a api.Authority, y float64, sc tlScale, todayX float64, now time.Time) tlBar {
	b := tlBar{Y: y, BarY: y + (tlRowH-tlBarH)/2, Name: truncate(displayName(a), tlLabelMax), FP: "sha256:" + shortFP(a.SHA256)}
	b.LabelY, b.SubY = y+15, y+29
	b.State = a.State
	if b.State == "" {
		b.State = "trusted"
	}
	nb, na := a.NotBefore.UTC(), a.NotAfter.UTC()
	x0, x1 := sc.x(nb), sc.x(na)
	b.ClipLeft, b.ClipRight = x0 < tlPlotX0, x1 > tlPlotX1
	x0, x1 = clampPlotX(x0), clampPlotX(x1)
	b.X, b.W = x0, max(x1-x0, 2)
	if todayX > x0 {
		b.FadedW = min(todayX, x1) - x0
	}
	b.NotYetValid = nb.After(now)
	b.Class = barClass(td, a, now)
	b.Degraded = td.Federation != nil && (td.Federation.State == "failing" || td.Federation.State == "stale")
	b.End = endText(na, now)
	b.Title = fmt.Sprintf("%s\n%s\nsha256:%s\nvalid %s – %s", td.Name, a.Subject, a.SHA256, nb.Format("2006-01-02 15:04 UTC"), na.Format("2006-01-02 15:04 UTC"))
	b.placeEndLabel(x0, x1)
	b.drawClipArrows(x0, x1)
	return b
}

// placeEndLabel puts the end label after the bar [x0, x1] where it fits
// in the plot, else inside a bar long enough to hold it, else before it.
func (b *tlBar) placeEndLabel(x0, x1 float64) {
	b.EndY = b.BarY + tlBarH - 4
	switch {
	case x1+tlEndRoom <= tlPlotX1:
		b.EndX, b.EndAnchor = x1+8, "start"
	case b.W >= tlEndRoom:
		b.EndX, b.EndAnchor, b.EndInside = x1-8, "end", true
	default:
		b.EndX, b.EndAnchor = x0-8, "end"
	}
}

// drawClipArrows draws an arrow head on each end of the bar [x0, x1]
// that the window cuts off.
func (b *tlBar) drawClipArrows(x0, x1 float64) {
	if b.ClipLeft {
		b.ArrowL = fmt.Sprintf("%s,%s %s,%s %s,%s", num(x0-2), num(b.BarY+tlBarH/2), num(x0+6), num(b.BarY+1), num(x0+6), num(b.BarY+tlBarH-1))
	}
	if b.ClipRight {
		b.ArrowR = fmt.Sprintf("%s,%s %s,%s %s,%s", num(x1+2), num(b.BarY+tlBarH/2), num(x1-6), num(b.BarY+1), num(x1-6), num(b.BarY+tlBarH-1))
	}
}

// barClass colours a validity bar: closeness to expiry first, then the
// local CA's state of its root, then "trusted" for other trust domains.
func barClass(td api.TrustDomain, a api.Authority, now time.Time) string {
	switch authorityExpiryClass(a, now) {
	case "expired":
		return "expired"
	case "critical":
		return "critical"
	case "warning":
		return "warning"
	}
	if td.Local && a.State != "" {
		return rootStateClass(a.State)
	}
	return "trusted"
}

func endText(notAfter, now time.Time) string {
	d := notAfter.Sub(now)
	if d <= 0 {
		return "expired " + notAfter.Format("2006-01-02") + " (" + api.Relative(d) + ")"
	}
	return "until " + notAfter.Format("2006-01-02") + " (" + api.Relative(d) + ")"
}

type tickAt struct {
	at    time.Time
	label string
}

// ticks picks calendar-aligned ticks for [lo, hi]: weeks for short
// windows, else the smallest month step giving at most ten ticks.
func ticks(lo, hi time.Time) []tickAt {
	var out []tickAt
	span := hi.Sub(lo)
	if span <= 80*day {
		t := time.Date(lo.Year(), lo.Month(), lo.Day(), 0, 0, 0, 0, time.UTC)
		for t.Weekday() != time.Monday || t.Before(lo) {
			t = t.Add(day)
		}
		for ; !t.After(hi); t = t.AddDate(0, 0, 7) {
			out = append(out, tickAt{t, t.Format("Jan 2")})
		}
		return out
	}
	months := span.Hours() / (24 * 30.44)
	step := 24
	for _, s := range []int{1, 2, 3, 6, 12, 24} {
		if months/float64(s) <= 10 {
			step = s
			break
		}
	}
	t := time.Date(lo.Year(), lo.Month(), 1, 0, 0, 0, 0, time.UTC)
	for t.Before(lo) || (int(t.Month())-1)%step != 0 {
		t = t.AddDate(0, 1, 0)
	}
	for ; !t.After(hi); t = t.AddDate(0, step, 0) {
		label := t.Format("Jan 2006")
		if step >= 12 {
			label = strconv.Itoa(t.Year())
		}
		out = append(out, tickAt{t, label})
	}
	return out
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// num formats a coordinate with at most one decimal.
func num(v float64) string {
	return strconv.FormatFloat(float64(int64(v*10+sign(v)*0.5))/10, 'f', -1, 64)
}

func sign(v float64) float64 {
	if v < 0 {
		return -1
	}
	return 1
}
