package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/statusui"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestRoutes(t *testing.T) {
	t.Parallel()
	h := New(newFixture(t).cfg)
	tests := []struct {
		method, path string
		want         int
		contentType  string
	}{
		{http.MethodGet, "/healthz", http.StatusOK, "text/plain; charset=utf-8"},
		{http.MethodGet, "/readyz", http.StatusOK, "text/plain; charset=utf-8"},
		{http.MethodGet, "/metrics", http.StatusOK, ""},
		{http.MethodGet, "/v1/trust", http.StatusOK, "application/json"},
		{http.MethodGet, "/v1/bundle", http.StatusOK, "application/json"},
		{http.MethodGet, "/v1/federation", http.StatusOK, "application/json"},
		{http.MethodGet, "/v1/snapshot", http.StatusOK, "application/json"},
		{http.MethodGet, "/ui", http.StatusOK, "text/html; charset=utf-8"},
		{http.MethodHead, "/ui", http.StatusOK, "text/html; charset=utf-8"},
		{http.MethodPost, "/v1/federation/refresh?trust_domain=peer.example", http.StatusOK, "text/plain; charset=utf-8"},

		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed, ""},
		{http.MethodPost, "/v1/trust", http.StatusMethodNotAllowed, ""},
		{http.MethodDelete, "/v1/federation", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/v1/federation/refresh?trust_domain=peer.example", http.StatusMethodNotAllowed, ""},
		{http.MethodPut, "/v1/snapshot", http.StatusMethodNotAllowed, ""},
		{http.MethodPost, "/ui", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/trust/x", http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := do(t, h, tt.method, tt.path)
			assert.Equal(t, tt.want, rec.Code, body(t, rec))
			if tt.contentType != "" {
				assert.Equal(t, tt.contentType, rec.Header().Get("Content-Type"))
			}
		})
	}
	assert.Equal(t, "ok\n", body(t, do(t, h, http.MethodGet, "/healthz")))
	assert.Contains(t, do(t, h, http.MethodPost, "/ui").Header().Get("Content-Security-Policy"), statusui.ContentSecurityPolicy,
		"the page refuses other methods itself, with its headers")
}

// /v1/bundle is the local bundle document, exactly what an https_spiffe
// peer needs as its bootstrap bundle (issue 21 item 5).
func TestBundleIsTheLocalBundleDocument(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec := do(t, New(f.cfg), http.MethodGet, "/v1/bundle")
	require.Equal(t, http.StatusOK, rec.Code)
	got, warnings, err := bundledoc.Parse(localTD, rec.Body.Bytes())
	require.NoError(t, err)
	assert.Empty(t, warnings)
	assert.True(t, f.cfg.CA.Bundle().Equal(got), "roots, sequence and refresh hint")
	assert.Equal(t, http.StatusMethodNotAllowed, do(t, New(f.cfg), http.MethodPost, "/v1/bundle").Code)

	// With what the CA revoked, named as the bundle endpoint names it.
	revoked := bundledoc.Revocation{Use: bundledoc.UseJWTSVID, KID: "gone", NotAfter: time.Now().Add(time.Hour).Truncate(time.Second).UTC()}
	f.cfg.Revocations = func() []bundledoc.Revocation { return []bundledoc.Revocation{revoked} }
	rec = do(t, New(f.cfg), http.MethodGet, "/v1/bundle")
	require.Equal(t, http.StatusOK, rec.Code)
	revs, err := bundledoc.ParseRevocations(rec.Body.Bytes())
	require.NoError(t, err)
	assert.Equal(t, []bundledoc.Revocation{revoked}, revs)
}

func TestNoTrustStoreMountsNoSnapshot(t *testing.T) {
	t.Parallel()
	cfg := newFixture(t).cfg
	cfg.Trust = nil
	h := New(cfg)
	assert.Equal(t, http.StatusNotFound, do(t, h, http.MethodGet, "/v1/snapshot").Code)
	assert.Equal(t, http.StatusNotFound, do(t, h, http.MethodGet, "/ui").Code)
	assert.Equal(t, http.StatusOK, do(t, h, http.MethodGet, "/v1/trust").Code)
}

func TestNewPanicsWithoutCA(t *testing.T) {
	t.Parallel()
	assert.PanicsWithValue(t, "admin: nil CA", func() { New(Config{}) })
}

// /readyz says why the server is not ready (503), or shows a warning
// without taking the replica out of service (200); not being ready says
// more and wins.
func TestReadyz(t *testing.T) {
	t.Parallel()
	cfg := newFixture(t).cfg
	var notReady, warning error
	cfg.Ready = func() error { return notReady }
	cfg.Warning = func() error { return warning }
	h := New(cfg)
	upstreamDown := errors.New("upstream u failing since 2026-11-28T10:00:00Z")
	for _, step := range []struct {
		notReady, warning error
		code              int
		body              string
	}{
		{nil, nil, http.StatusOK, "ok\n"},
		{errors.New("bundle file peer.json: serving the last good bundle"), nil,
			http.StatusServiceUnavailable, "not ready: bundle file peer.json: serving the last good bundle\n"},
		{nil, upstreamDown, http.StatusOK, "ok (warning: upstream u failing since 2026-11-28T10:00:00Z)\n"},
		{errors.New("no valid intermediate"), upstreamDown, http.StatusServiceUnavailable, "not ready: no valid intermediate\n"},
	} {
		notReady, warning = step.notReady, step.warning
		rec := do(t, h, http.MethodGet, "/readyz")
		assert.Equal(t, step.code, rec.Code, step.body)
		assert.Equal(t, step.body, body(t, rec))
	}
}

func TestMetricsServesTheGatherer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := New(f.cfg)
	rec := do(t, h, http.MethodGet, "/metrics")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Empty(t, body(t, rec), "an empty registry")

	f.cfg.Gatherer = nil
	rec = do(t, New(f.cfg), http.MethodGet, "/metrics")
	assert.Equal(t, http.StatusOK, rec.Code, "nil serves an empty registry")
}

// /v1/trust's field names are an API: scripts and trustbridge's own
// tests read them.
func TestTrustJSON(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec := do(t, New(f.cfg), http.MethodGet, "/v1/trust")
	require.Equal(t, http.StatusOK, rec.Code)
	raw := body(t, rec)
	assert.Contains(t, raw, "{\n  \"trust_domain\": \"example.org\",\n", "indented")

	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &doc))
	assert.Equal(t, "example.org", doc["trust_domain"])
	assert.InDelta(t, 7, doc["sequence"], 0)
	assert.InDelta(t, 300, doc["refresh_hint_seconds"], 0)
	auths, ok := doc["authorities"].([]any)
	require.True(t, ok)
	require.Len(t, auths, 2)
	active := auths[0].(map[string]any)
	assert.ElementsMatch(t, []string{"id", "state", "sha256", "subject", "not_before", "not_after", "prepared_at", "activated_at"}, keys(active))
	assert.Equal(t, "01", active["id"])
	assert.Equal(t, "active", active["state"])
	assert.Equal(t, "aa", active["sha256"])
	assert.Equal(t, f.ca.roots[0].Cert.Subject.String(), active["subject"])
	assert.Equal(t, "2026-11-21T12:00:00Z", active["activated_at"])
	prepared := auths[1].(map[string]any)
	assert.Equal(t, "prepared", prepared["state"])
	assert.NotContains(t, prepared, "activated_at", "unset times are left out")
	assert.NotContains(t, prepared, "retired_at")
	assert.NotContains(t, prepared, "remove_after")

	var typed api.Trust
	require.NoError(t, json.Unmarshal([]byte(raw), &typed))
	assert.Equal(t, f.ca.roots[0].Cert.NotAfter.UTC(), typed.Authorities[0].NotAfter)
}

func TestTrustWithoutRootsIsAnEmptyList(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ca.roots = nil
	assert.Contains(t, body(t, do(t, New(f.cfg), http.MethodGet, "/v1/trust")), `"authorities": []`)
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestFederationStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec := do(t, New(f.cfg), http.MethodGet, "/v1/federation")
	require.Equal(t, http.StatusOK, rec.Code)
	var status []api.FederationStatus
	require.NoError(t, json.Unmarshal([]byte(body(t, rec)), &status))
	require.Len(t, status, 1)
	assert.Equal(t, "peer.example", status[0].TrustDomain)
	assert.Equal(t, string(federation.StateOK), status[0].State)

	f.cfg.Federation = nil
	rec = do(t, New(f.cfg), http.MethodGet, "/v1/federation")
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "[]\n", body(t, rec), "no federation: an empty list, not null")
}

// /v1/federation lists every bundle the trust store holds for another
// trust domain, not only the polled ones: one set at run time (bundle set)
// and a relayed bundle file too, each with its origin (issue 36).
func TestFederationListsHeldBundles(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	store := f.cfg.Trust.(*trust.Store)
	set := testca.New(t, "set.example").Bundle()
	set.SetSequenceNumber(9)
	store.Set(api.OriginStatic, set)
	store.Set("file:/etc/relayed.json", testca.New(t, "relayed.example").Bundle())
	rec := do(t, New(f.cfg), http.MethodGet, "/v1/federation")
	require.Equal(t, http.StatusOK, rec.Code)
	var status []api.FederationStatus
	require.NoError(t, json.Unmarshal([]byte(body(t, rec)), &status))
	type row struct{ td, origin, state string }
	var got []row
	for _, st := range status {
		got = append(got, row{st.TrustDomain, st.Origin, st.State})
	}
	assert.Equal(t, []row{
		{"peer.example", "file", "ok"},
		{"relayed.example", "bundle-file:/etc/relayed.json", api.StateStatic},
		{"set.example", api.OriginStatic, api.StateStatic},
	}, got, "sorted by name; our own trust domain is not listed")
	require.Len(t, status, 3)
	assert.Equal(t, uint64(9), *status[2].Sequence)
	require.Len(t, status[2].Authorities, 1)
	assert.Equal(t, api.KindX509, status[2].Authorities[0].Kind)
	assert.Equal(t, "set at run time by bundle set", api.SourceLabel(status[2].Origin, status[2].Held))
	assert.Equal(t, "bundle file /etc/relayed.json", api.SourceLabel(status[1].Origin, status[1].Held))
}

func TestRefresh(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		mutate   func(*fixture)
		td       string
		want     int
		contains string
	}{
		{"refreshed", nil, "peer.example", http.StatusOK, "refreshed peer.example\n"},
		{"bad trust domain", nil, "Peer.example", http.StatusBadRequest, `trust_domain "Peer.example"`},
		{"no trust domain", nil, "", http.StatusBadRequest, `trust_domain ""`},
		{"no federation", func(f *fixture) { f.cfg.Federation = nil }, "peer.example", http.StatusNotFound, "no federation is configured"},
		{"follower", func(f *fixture) { f.cfg.IsLeader = func() bool { return false } }, "peer.example", http.StatusConflict, "not the leader"},
		{"leader", func(f *fixture) { f.cfg.IsLeader = func() bool { return true } }, "peer.example", http.StatusOK, "refreshed peer.example"},
		{"not federated", nil, "nowhere.example", http.StatusNotFound, `trust domain "nowhere.example" is not federated`},
		{"fetch fails", func(f *fixture) { f.fed.err = errors.New("federation: peer.example: 503") }, "peer.example", http.StatusBadGateway, "federation: peer.example: 503"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if tt.mutate != nil {
				tt.mutate(f)
			}
			rec := refresh(t, New(f.cfg), tt.td)
			assert.Equal(t, tt.want, rec.Code)
			assert.Contains(t, body(t, rec), tt.contains)
			assert.Equal(t, "text/plain; charset=utf-8", rec.Header().Get("Content-Type"))
		})
	}
}

// A web page the operator visits cannot drive the admin API: browsers
// send Origin or Sec-Fetch-Site on its requests, the CLI neither.
func TestRefreshRefusesCrossSite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header []string
		want   int
	}{
		{[]string{"Origin", "https://evil.example"}, http.StatusForbidden},
		{[]string{"Origin", "null"}, http.StatusForbidden},
		{[]string{"Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{[]string{"Sec-Fetch-Site", "same-site"}, http.StatusForbidden},
		{[]string{"Sec-Fetch-Site", "same-origin"}, http.StatusForbidden},
		{[]string{"Sec-Fetch-Site", "none"}, http.StatusOK}, // typed into the address bar
		{nil, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.header, ": "), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			rec := refresh(t, New(f.cfg), "peer.example", tt.header...)
			assert.Equal(t, tt.want, rec.Code)
			if tt.want == http.StatusForbidden {
				assert.Equal(t, "cross-site requests are refused\n", body(t, rec))
				assert.Zero(t, f.fed.calls(), "no fetch")
			}
		})
	}
	// Refused before anything else is looked at, even a bad trust domain.
	rec := refresh(t, New(newFixture(t).cfg), "Bad", "Origin", "https://evil.example")
	assert.Equal(t, http.StatusForbidden, rec.Code)
}

// Each refresh is a real fetch: one a second, counted from the last one
// let through, on the injected clock.
func TestRefreshRateLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := New(f.cfg)
	require.Equal(t, http.StatusOK, refresh(t, h, "peer.example").Code)

	rec := refresh(t, h, "peer.example")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "one refresh a second")
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.Equal(t, "one refresh a second; try again\n", body(t, rec))

	f.clock.Step(999 * time.Millisecond)
	assert.Equal(t, http.StatusTooManyRequests, refresh(t, h, "peer.example").Code, "refused ones do not restart the second")
	f.clock.Step(time.Millisecond)
	assert.Equal(t, http.StatusOK, refresh(t, h, "peer.example").Code, "a second after the last refresh")
	assert.Equal(t, http.StatusTooManyRequests, refresh(t, h, "peer.example").Code)
	assert.Equal(t, 2, f.fed.calls(), "refused refreshes fetch nothing")

	// Refusals for other reasons do not count against the limit.
	f.clock.Step(time.Second)
	assert.Equal(t, http.StatusNotFound, refresh(t, h, "nowhere.example").Code)
	assert.Equal(t, http.StatusOK, refresh(t, h, "peer.example").Code)

	// The limit is per handler, not per process.
	assert.Equal(t, http.StatusOK, refresh(t, New(f.cfg), "peer.example").Code)
}

// TestNoDebugHandlers: the admin handler serves its own routes only.
// controller-runtime links net/http/pprof, which registers /debug/pprof/
// on http.DefaultServeMux; nothing in trustbridge serves that mux, and the
// admin listener (anyone who reaches it: a read-only audience) must not
// hand out heap profiles or goroutine dumps.
func TestNoDebugHandlers(t *testing.T) {
	h := New(Config{CA: newFakeCA(t)})
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=2", "/debug/vars"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		assert.Equal(t, http.StatusNotFound, rec.Code, path)
	}
}
