package statusui

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/trustview"
)

// In upstream mode the summary shows the upstream authority: when it last
// signed, and while it fails, since when, how often and why (escaped like
// every other string). Outside upstream mode there is no such card.
func TestPageUpstreamAuthority(t *testing.T) {
	root := localRoot("active", "CN=corp root", "2026-01-01T00:00:00Z", "2036-01-01T00:00:00Z", at("2026-01-01T00:00:00Z"))
	s := trustview.Snapshot{Time: fixtureNow, TrustDomain: "region.example", TrustDomains: []trustview.TrustDomain{
		{Name: "region.example", Local: true, Sources: []string{"ca"}, Authorities: []trustview.Authority{root}},
	}}
	get := func() dom {
		t.Helper()
		rec := serve(t, Handler(func() trustview.Snapshot { return s }, nil), http.MethodGet)
		require.Equal(t, http.StatusOK, rec.Code)
		d := parseDOM(t, rec.Body)
		assertInert(t, d)
		return d
	}
	assert.Nil(t, get().byID("upstream"), "no upstream card for a self-signed CA")

	s.CA = &trustview.CAStatus{Upstream: &trustview.UpstreamStatus{Name: "trustbridge corp.example:15012", LastSuccess: ago(3 * time.Hour)}}
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
	assert.Equal(t, "failing since 1h ago · 6 failed requests, last 2m ago; the current intermediate keeps signing", text(d.byID("upstream-failing")))
	assert.Equal(t, s.CA.Upstream.LastError, text(d.byID("upstream-error")), "the error is shown as text")

	p := build(s, nil, false)
	require.NotNil(t, p.Summary.Upstream)
	assert.Equal(t, fixtureNow.Add(-90*time.Minute).Format(time.RFC3339), p.Summary.Upstream.FailingSince.ISO)
}
