package statusui

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// In upstream mode the summary shows the upstream authority: when it last
// signed, and while it fails, since when, how often and why (escaped like
// every other string). Outside upstream mode there is no such card.
func TestPageUpstreamAuthority(t *testing.T) {
	root := localRoot("active", "CN=corp root", "2026-01-01T00:00:00Z", "2036-01-01T00:00:00Z", at("2026-01-01T00:00:00Z"))
	mid := localRoot("active", "CN=trustbridge intermediate CA", fixtureNow.Add(-3*time.Hour).Format(time.RFC3339), fixtureNow.Add(45*time.Hour).Format(time.RFC3339), ago(3*time.Hour))
	mid.Upstream = "trustbridge corp.example:15012"
	s := api.Snapshot{Time: fixtureNow, TrustDomain: "region.example", TrustDomains: []api.TrustDomain{
		{Name: "region.example", Local: true, Sources: []string{"ca"}, Authorities: []api.Authority{root}},
	}}
	get := func() dom {
		t.Helper()
		rec := serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
		require.Equal(t, http.StatusOK, rec.Code)
		d := parseDOM(t, rec.Body)
		assertInert(t, d)
		return d
	}
	assert.Nil(t, get().byID("upstream"), "no upstream card for a self-signed CA")

	s.TrustDomains[0].Authorities = []api.Authority{mid, root}
	s.CA = &api.CAStatus{Upstream: &api.UpstreamStatus{Name: "trustbridge corp.example:15012", LastSuccess: ago(3 * time.Hour)}}
	d := get()
	card := d.byID("upstream")
	require.NotNil(t, card)
	assert.True(t, hasClass(card, "good"))
	assert.Contains(t, text(card), "ok")
	assert.Contains(t, text(card), "trustbridge corp.example:15012 · last signed 3h ago")
	assert.Nil(t, d.byID("upstream-failing"))

	s.CA.Upstream.Failures, s.CA.Upstream.FailingSince, s.CA.Upstream.LastErrorAt = 6, ago(90*time.Minute), ago(2*time.Minute)
	s.CA.Upstream.LastError = `ca: upstream trustbridge corp.example:15012: intermediate refused: <script>alert(1)</script> is not a CA certificate`
	d = get()
	card = d.byID("upstream")
	require.NotNil(t, card)
	assert.True(t, hasClass(card, "warn"))
	assert.Contains(t, text(card), "failing")
	assert.Equal(t, "failing since 90m ago · 6 failed requests, last 2m ago; the current intermediate keeps signing", text(d.byID("upstream-failing")))
	assert.Equal(t, s.CA.Upstream.LastError, text(d.byID("upstream-error")), "the error is shown as text")

	p := build(s, nil, false)
	require.NotNil(t, p.Summary.Upstream)
	assert.Equal(t, fixtureNow.Add(-90*time.Minute).Format(time.RFC3339), p.Summary.Upstream.FailingSince.ISO)

	// A first start whose upstream refuses: no intermediate, nothing signs.
	s.TrustDomains[0].Authorities = nil
	s.CA.Upstream = &api.UpstreamStatus{Name: "trustbridge corp.example:15012", Failures: 2, FailingSince: ago(5 * time.Minute), LastErrorAt: ago(time.Minute),
		NextAttempt: at(fixtureNow.Add(4 * time.Minute).Format(time.RFC3339)), Refused: true, LastError: "permission denied"}
	d = get()
	card = d.byID("upstream")
	require.NotNil(t, card)
	assert.True(t, hasClass(card, "bad"), "with no intermediate the CA signs nothing")
	assert.Equal(t, "failing since 5m ago · 2 failed requests, last 60s ago, next in 4m · refused: asking again does not mend it; no intermediate: the CA signs nothing",
		text(d.byID("upstream-failing")))
}

// The snapshot lists the local CA's intermediate with the local trust
// domain's authorities. The page says what it is, and neither counts it
// as a trusted root nor alarms at its short life: the upstream's root
// is what peers trust, and the upstream card shows when the intermediate
// ends.
func TestPageIntermediateIsNotATrustedRoot(t *testing.T) {
	corpRoot := root("CN=corp root", "2026-01-01T00:00:00Z", "2036-01-01T00:00:00Z")
	mid := root("CN=trustbridge downstream intermediate CA", "2026-11-22T08:00:00Z", fixtureNow.Add(20*time.Hour).Format(time.RFC3339))
	mid.State, mid.Upstream = "active", "trustbridge upstream corp:15012"
	s := api.Snapshot{Time: fixtureNow, TrustDomain: "region.example",
		CA: &api.CAStatus{Upstream: &api.UpstreamStatus{Name: "trustbridge upstream corp:15012", LastSuccess: ago(4 * time.Hour)}},
		TrustDomains: []api.TrustDomain{
			{Name: "region.example", Local: true, Sources: []string{"ca"}, Authorities: []api.Authority{mid, corpRoot}},
		}}

	p := build(s, nil, false)
	assert.Equal(t, 1, p.Summary.X509, "only the upstream's root is trusted")
	assert.Zero(t, p.Summary.ActiveRoots)
	assert.Equal(t, "2036-01-01 00:00", p.Summary.Expiry.Abs, "the next expiry is the root's, not the intermediate's")
	assert.Equal(t, "fine", p.Summary.ExpiryClass)
	assert.Equal(t, 1, p.Rows[0].X509)
	assert.Equal(t, "fine", p.Rows[0].ExpiryClass)
	for _, b := range p.Timeline.Bars {
		assert.NotEqual(t, "critical", b.Class, "no bar alarms at the intermediate's 20h")
	}

	rec := serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assertInert(t, d)
	assert.Equal(t, "intermediate until in 20h", text(d.byID("upstream-intermediate")))
	assert.Equal(t, "own CA: an intermediate under trustbridge upstream corp:15012's roots", text(d.byID("own-ca")))
	rows := d.withClass("authority-row")
	require.Len(t, rows, 2)
	row := text(rows[0])
	for _, want := range []string{"X.509 intermediate", "active", "signed by upstream trustbridge upstream corp:15012", "not published, not trusted"} {
		assert.Contains(t, row, want)
	}
	until := parseDOMNode(rows[0]).withClass("date")
	require.NotEmpty(t, until)
	assert.True(t, hasClass(until[1], "exp-fine"))
}

// An intermediate is judged by the share of its life left: renewal is due
// at half, so under a quarter is a warning and under an eighth critical,
// on the card (which a follower, whose upstream never fails, shows too),
// the table and the timeline.
func TestPageIntermediateNearItsEnd(t *testing.T) {
	for _, tc := range []struct {
		left        time.Duration
		class, card string
	}{
		{20 * time.Hour, "fine", "good"},
		{5 * time.Hour, "warning", "warn"},
		{2 * time.Hour, "critical", "bad"},
		{-time.Hour, "expired", "bad"},
	} {
		t.Run(tc.class, func(t *testing.T) {
			notAfter := fixtureNow.Add(tc.left)
			mid := root("CN=intermediate", notAfter.Add(-24*time.Hour).Format(time.RFC3339), notAfter.Format(time.RFC3339))
			mid.State, mid.Upstream = "active", "u"
			s := api.Snapshot{Time: fixtureNow, TrustDomain: "region.example",
				CA: &api.CAStatus{Upstream: &api.UpstreamStatus{Name: "u", LastSuccess: ago(time.Hour)}},
				TrustDomains: []api.TrustDomain{{Name: "region.example", Local: true, Sources: []string{"ca"},
					Authorities: []api.Authority{mid, root("CN=corp root", "2026-01-01T00:00:00Z", "2036-01-01T00:00:00Z")}}}}
			p := build(s, nil, false)
			assert.Equal(t, tc.class, p.Summary.Upstream.IntermediateClass)
			assert.Equal(t, tc.card, p.Summary.Upstream.Class)
			assert.Equal(t, tc.class, p.Authorities[0].UntilClass)
			rec := serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
			assert.True(t, hasClass(parseDOM(t, rec.Body).byID("upstream"), tc.card))
		})
	}
}
