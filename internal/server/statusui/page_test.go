package statusui

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

func serve(t *testing.T, h http.Handler, method string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, "/ui", nil))
	return rec
}

func TestHandlerMethodsAndHeaders(t *testing.T) {
	s, fs := realisticSnapshot()
	tests := []struct {
		method   string
		status   int
		wantBody bool
	}{
		{http.MethodGet, http.StatusOK, true},
		{http.MethodHead, http.StatusOK, false},
		{http.MethodPost, http.StatusMethodNotAllowed, false},
		{http.MethodPut, http.StatusMethodNotAllowed, false},
		{http.MethodDelete, http.StatusMethodNotAllowed, false},
		{http.MethodPatch, http.StatusMethodNotAllowed, false},
		{http.MethodOptions, http.StatusMethodNotAllowed, false},
		{"TRACE", http.StatusMethodNotAllowed, false},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			calls := 0
			h := Handler(func() api.Snapshot { calls++; return s }, func(api.Snapshot) []api.Finding { return fs })
			rec := serve(t, h, tt.method)
			require.Equal(t, tt.status, rec.Code)
			hdr := rec.Header()
			assert.Equal(t, "no-store", hdr.Get("Cache-Control"))
			assert.Equal(t, "nosniff", hdr.Get("X-Content-Type-Options"))
			assert.Equal(t, "DENY", hdr.Get("X-Frame-Options"))
			assert.Equal(t, "no-referrer", hdr.Get("Referrer-Policy"))
			csp := hdr.Get("Content-Security-Policy")
			assert.True(t, strings.HasPrefix(csp, "default-src 'none'; style-src 'unsafe-inline'; img-src data:"), csp)
			assert.Contains(t, csp, "frame-ancestors 'none'")
			assert.NotContains(t, csp, "script-src")
			if tt.status != http.StatusOK {
				assert.Equal(t, "GET, HEAD", hdr.Get("Allow"))
				assert.Zero(t, calls, "a refused method must not build a snapshot")
				return
			}
			assert.Equal(t, "text/html; charset=utf-8", hdr.Get("Content-Type"))
			n, err := strconv.Atoi(hdr.Get("Content-Length"))
			require.NoError(t, err)
			assert.Greater(t, n, 10000)
			assert.Equal(t, tt.wantBody, rec.Body.Len() > 0)
			if tt.wantBody {
				assert.Equal(t, n, rec.Body.Len())
				assert.True(t, strings.HasPrefix(rec.Body.String(), "<!DOCTYPE html>"))
			}
			assert.Equal(t, 1, calls)
		})
	}
}

func TestHandlerNilSnapshotPanics(t *testing.T) {
	assert.PanicsWithValue(t, "statusui: nil snapshot function", func() { Handler(nil, nil) })
}

func TestPageFindingsNotEvaluated(t *testing.T) {
	s, _ := realisticSnapshot()
	rec := serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assert.Contains(t, text(d.byID("findings")), "not evaluated")
	assert.Empty(t, d.withClass("finding"))
}

func TestPageNoFindings(t *testing.T) {
	s, _ := realisticSnapshot()
	rec := serve(t, Handler(func() api.Snapshot { return s }, func(api.Snapshot) []api.Finding { return nil }), http.MethodGet)
	d := parseDOM(t, rec.Body)
	assert.Contains(t, text(d.byID("findings")), "No findings")
}

// TestPageContent checks the realistic page answers whom, by which keys,
// since when and from where.
func TestPageContent(t *testing.T) {
	s, fs := realisticSnapshot()
	rec := serve(t, Handler(func() api.Snapshot { return s }, func(api.Snapshot) []api.Finding { return fs }), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assertInert(t, d)

	assert.Equal(t, "prod.acme.example", text(d.byID("local-trust-domain")))
	assert.Contains(t, text(d.byID("replica")), "trustbridge-7d9f8c6b5-x2k4q")
	assert.Contains(t, text(d.byID("replica")), "leader")
	assert.Equal(t, "2026-11-22T12:00:00Z", attr(d.byID("snapshot-time"), "datetime"))

	// One table row per trust domain, in snapshot order, with its state.
	rows := d.withClass("td-row")
	require.Len(t, rows, len(s.TrustDomains))
	wantState := map[string]string{
		"prod.acme.example": "local", "analytics.vendor.example": "failing", "corp-root.acme.example": "static",
		"legacy.acme.example": "stale", "partner-bank.example": "ok",
	}
	for i, row := range rows {
		name := s.TrustDomains[i].Name
		assert.Equal(t, name, attr(row, "data-td"))
		badge := parseDOMNode(row).withClass("badge")
		require.NotEmpty(t, badge, name)
		assert.Equal(t, wantState[name], text(badge[0]), name)
		assert.True(t, hasClass(badge[0], wantState[name]), name)
	}
	table := text(d.byID("trust-domains"))
	for _, want := range []string{
		"https://bundles.vendor.example/analytics", "https_web", "https_spiffe", "spiffe://partner-bank.example/trustbridge",
		"1289", "4m ago", "in 26m", "x509: certificate signed by unknown authority", "4 consecutive failures",
		"timeout ×1, tls ×4", "/etc/trustbridge/bundles/corp-root.json", "partner-bank", "--federate", "--federation-config",
	} {
		assert.Contains(t, table, want)
	}

	// Graph: the local node and one per other trust domain, edges coloured
	// by state, the file-sourced one dashed.
	graph := parseDOMNode(d.byID("federation-graph"))
	nodes := graph.withClass("node")
	require.Len(t, nodes, len(s.TrustDomains))
	edges := graph.withClass("edge")
	require.Len(t, edges, len(s.TrustDomains)-1)
	var dashed, failing int
	for _, e := range edges {
		if hasClass(e, "dashed") {
			dashed++
			assert.True(t, hasClass(e, "edge-static"))
		}
		if hasClass(e, "edge-failing") {
			failing++
		}
	}
	assert.Equal(t, 1, dashed)
	assert.Equal(t, 1, failing)
	labels := text(graph.root)
	assert.Contains(t, labels, "https_spiffe")
	assert.Contains(t, labels, "bundle file")

	// Timeline: one bar per X.509 authority, labelled with subject and
	// short fingerprint, and today marked.
	tl := parseDOMNode(d.byID("authority-timeline"))
	bars := tl.withClass("authority")
	x509 := 0
	for _, td := range s.TrustDomains {
		for _, a := range td.Authorities {
			if a.Kind == api.KindX509 {
				x509++
			}
		}
	}
	require.Len(t, bars, x509)
	retired := s.TrustDomains[0].Authorities[0]
	assert.Contains(t, text(bars[0]), "prod.acme.example root 2025-12")
	assert.Contains(t, text(bars[0]), "sha256:"+retired.SHA256[:11])
	assert.Contains(t, text(bars[0]), "retired")
	today := d.byID("today-line")
	require.NotNil(t, today)
	x, err := strconv.ParseFloat(attr(today, "x1"), 64)
	require.NoError(t, err)
	assert.Greater(t, x, tlPlotX0)
	assert.Less(t, x, tlPlotX1)
	assert.Equal(t, "today 2026-11-22", text(d.byID("today-label")))
	classes := map[string]int{}
	for _, b := range tl.withClass("bar") {
		for _, c := range strings.Fields(attr(b, "class")) {
			classes[c]++
		}
	}
	assert.Equal(t, 1, classes["bar-warning"], "retired root expiring in 9 days")
	assert.Equal(t, 1, classes["bar-critical"], "vendor root expiring in 5 days")
	assert.Equal(t, 1, classes["bar-active"])
	assert.Equal(t, 1, classes["bar-prepared"])
	assert.Equal(t, 4, classes["bar-trusted"])

	// Findings: critical first, each with its fix.
	fl := d.withClass("finding")
	require.Len(t, fl, len(fs))
	for i, f := range fl {
		wantCritical := i < 2
		assert.Equal(t, wantCritical, hasClass(f, "critical"), "finding %d", i)
		assert.Contains(t, text(f), "Fix:")
	}

	// Authorities: every one, JWT keys too, with since.
	ar := d.withClass("authority-row")
	assert.Len(t, ar, x509+2)
	auth := text(d.byID("authorities"))
	assert.Contains(t, auth, "key c2b3Xq9LmT")
	assert.Contains(t, auth, "2026-06-02 08:00")
	assert.Contains(t, auth, "RSA 2048")
}

// TestPageEscapesHostileStrings puts markup and script in every free-text
// field and checks that they arrive as text, never as elements or
// attributes.
func TestPageEscapesHostileStrings(t *testing.T) {
	s, fs := hostileSnapshot()
	rec := serve(t, Handler(func() api.Snapshot { return s }, func(api.Snapshot) []api.Finding { return fs }), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	body := rec.Body.String()
	for _, bad := range []string{"<script", "<img", "<svg onload"} {
		assert.False(t, strings.Contains(strings.ToLower(body), bad), "body contains %q", bad)
	}
	d := parseDOM(t, strings.NewReader(body))
	assertInert(t, d)
	// The strings are shown, as text, where they belong.
	assert.Equal(t, hostile, text(d.byID("local-trust-domain")))
	for _, id := range []string{"replica", "findings", "trust-domains", "authorities", "federation-graph", "authority-timeline", "oidc-issuers"} {
		assert.Contains(t, text(d.byID(id)), `<script>alert(1)</script>`, id)
	}
	assert.Contains(t, text(d.byID("trust-domains")), "javascript:alert(4)")
	assert.Contains(t, text(d.byID("oidc-issuers")), "javascript:alert(5)")
	// No snapshot value becomes a class: the unknown state is "unknown".
	for _, n := range d.elements("") {
		assert.NotContains(t, attr(n, "class"), "alert", n.Data)
	}
}

func TestPageDeterministic(t *testing.T) {
	s, fs := realisticSnapshot()
	s.TrustDomains[1].Federation.Refusals = map[string]uint64{"tls": 4, "timeout": 1, "sequence_regression": 2, "profile_mismatch": 1, "too_large": 3}
	var first []byte
	for i := range 20 {
		var buf bytes.Buffer
		require.NoError(t, render(&buf, build(s, fs, true)))
		if i == 0 {
			first = buf.Bytes()
			continue
		}
		require.Equal(t, string(first), buf.String(), "render %d differs", i)
	}
	assert.Contains(t, string(first), "profile_mismatch ×1, sequence_regression ×2, timeout ×1, tls ×4, too_large ×3")
}

func TestPageEmptySnapshot(t *testing.T) {
	rec := serve(t, Handler(func() api.Snapshot { return api.Snapshot{} }, nil), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assertInert(t, d)
	assert.Contains(t, text(d.byID("authority-timeline")), "No X.509 authority")
	assert.Contains(t, text(d.byID("federation-graph")), "no federated trust domains")
	assert.Nil(t, d.byID("snapshot-time"))
}

func TestBuildSummary(t *testing.T) {
	s, fs := realisticSnapshot()
	p := build(s, fs, true)
	assert.Equal(t, summary{
		TrustDomains: 5, Federated: 3, Static: 1, Local: 1, OK: 1, Failing: 1, Stale: 1,
		X509: 8, Keys: 2, Critical: 2, Warning: 3, ActiveRoots: 1, PreparedRoots: 1, Retired: 1,
		Expiry:      stampOf(at("2026-11-27T09:30:00Z"), fixtureNow),
		ExpiryClass: "critical", ExpiryWhat: "analytics.vendor.example · analytics.vendor.example SPIFFE root",
	}, p.Summary)
	assert.Equal(t, "in 4d21h", p.Summary.Expiry.Rel)
}

// The summary tells a bundle set at run time from a bundle file, and
// counts a peer that never answered as failing (issue 36).
func TestBuildSummaryHeldKinds(t *testing.T) {
	s := api.Snapshot{Time: fixtureNow, TrustDomain: "example.org", TrustDomains: []api.TrustDomain{
		{Name: "example.org", Local: true, Sources: []string{"ca"}},
		{Name: "set.example", Sources: []string{"static"}},
		{Name: "file.example", Sources: []string{"file:/etc/file.json"}},
		{Name: "north.example", Federation: &api.Federation{EndpointURL: "https://north.example/", State: "failing", ConsecutiveFailures: 8}},
	}}
	p := build(s, nil, false)
	assert.Equal(t, 1, p.Summary.BundleSet)
	assert.Equal(t, 1, p.Summary.Static)
	assert.Equal(t, 1, p.Summary.Failing)
	assert.Equal(t, 0, p.Summary.Pending)
	rec := httptest.NewRecorder()
	require.NoError(t, render(rec, p))
	assert.Contains(t, rec.Body.String(), "1 from bundle files · 1 set by bundle set · 1 local")
	assert.Contains(t, rec.Body.String(), `<span class="dot failing"></span>1 failing`)
}

func TestTrustDomainState(t *testing.T) {
	tests := []struct {
		td         api.TrustDomain
		text, cls  string
		origin     string
		originMore string
	}{
		{api.TrustDomain{Local: true, Sources: []string{"ca"}}, "local", "local", "own CA", ""},
		{api.TrustDomain{Local: true, Sources: []string{"ca", "file:/b.json"}}, "local", "local", "own CA", "+ bundle file /b.json"},
		{api.TrustDomain{Sources: []string{"file:/a.json", "file:/b.json"}}, "static", "static", "bundle file", "/a.json, /b.json"},
		{api.TrustDomain{Sources: []string{"static"}}, "static", "static", "bundle set", "set at run time by trustbridge bundle set"},
		{api.TrustDomain{Sources: []string{"other"}}, "static", "static", "other", ""},
		{api.TrustDomain{}, "static", "static", "—", ""},
		{api.TrustDomain{Federation: &api.Federation{State: "ok", Origin: "flag"}}, "ok", "ok", "flag", "--federate"},
		{api.TrustDomain{Federation: &api.Federation{State: "failing", Origin: "file"}}, "failing", "failing", "config file", "--federation-config"},
		{api.TrustDomain{Federation: &api.Federation{State: "stale", Origin: "crd:west"}}, "stale", "stale", "CRD", "west"},
		{api.TrustDomain{Federation: &api.Federation{State: "pending", Origin: "elsewhere"}}, "pending", "pending", "elsewhere", ""},
		{api.TrustDomain{Federation: &api.Federation{State: "weird"}}, "weird", "unknown", "—", ""},
		{api.TrustDomain{Federation: &api.Federation{}}, "unknown", "unknown", "—", ""},
	}
	for i, tt := range tests {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			text, cls := tdState(tt.td)
			assert.Equal(t, tt.text, text)
			assert.Equal(t, tt.cls, cls)
			o, more := origin(tt.td)
			assert.Equal(t, tt.origin, o)
			assert.Equal(t, tt.originMore, more)
		})
	}
}

func TestExpiryClass(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{-time.Hour, "expired"}, {0, "expired"}, {time.Hour, "critical"}, {7 * day, "critical"},
		{7*day + time.Minute, "warning"}, {30 * day, "warning"}, {31 * day, "fine"},
	}
	for _, tt := range tests {
		t.Run(tt.in.String(), func(t *testing.T) {
			assert.Equal(t, tt.want, expiryClass(fixtureNow.Add(tt.in), fixtureNow))
		})
	}
}

func TestDisplayName(t *testing.T) {
	tests := []struct {
		a    api.Authority
		want string
	}{
		{api.Authority{Subject: "CN=root,O=Acme"}, "root"},
		{api.Authority{Subject: "O=Acme,CN=a\\,b"}, "a,b"},
		{api.Authority{Subject: "O=Acme+CN=multi"}, "multi"},
		{api.Authority{Subject: "O=Acme"}, "O=Acme"},
		{api.Authority{KeyID: "k1"}, "key k1"},
		{api.Authority{}, "(unnamed)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) { assert.Equal(t, tt.want, displayName(tt.a)) })
	}
}

func TestTruncate(t *testing.T) {
	assert.Equal(t, "abc", truncate("abc", 3))
	assert.Equal(t, "ab…", truncate("abcd", 3))
	assert.Equal(t, "äö…", truncate("äöüß", 3))
}

func TestNum(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 1.25: "1.3", -1.25: "-1.3", 100: "100", 12.04: "12"} {
		assert.Equal(t, want, num(v), fmt.Sprint(v))
	}
}

// The trust policy panel says, per federated trust domain, which local
// workloads may trust it and by which rule, with the policy's sources
// and conflicts.
func TestPagePolicy(t *testing.T) {
	s, fs := realisticSnapshot()
	rec := serve(t, Handler(func() api.Snapshot { return s }, func(api.Snapshot) []api.Finding { return fs }), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)
	assertInert(t, d)
	panel := text(d.byID("trust-policy"))
	for _, want := range []string{
		"2 rules", "default deny", "file:/etc/trustbridge/policy.yaml", "last change refused, previous rules kept: ClusterTrustPolicy ops-wide",
		`rule "payments-to-bank"`, "payments-to-bank", "spiffe://prod.acme.example/ns/payments/* · namespace=payments labels=tier=api",
		"peers: spiffe://partner-bank.example/ns/billing/sa/api", "3 workloads seen, recently spiffe://prod.acme.example/ns/payments/sa/checkout",
		"peers: every member",
	} {
		assert.Contains(t, panel, want)
	}
	rows := d.withClass("policy-row")
	require.Len(t, rows, len(s.TrustDomains)-1, "every federated trust domain, not the local one")
	who := map[string]string{}
	for _, row := range rows {
		who[attr(row, "data-td")] = text(parseDOMNode(row).withClass("who")[0])
	}
	assert.Equal(t, "workloads of 2 rules", who["partner-bank.example"])
	assert.Equal(t, "no workload (no rule names it; default deny)", who["analytics.vendor.example"])

	// Without a policy: everyone, said plainly.
	s.TrustPolicy = &api.TrustPolicy{Default: "allow"}
	for i := range s.TrustDomains {
		if !s.TrustDomains[i].Local {
			s.TrustDomains[i].TrustedBy = &api.TrustedBy{Default: "allow"}
		}
	}
	rec = serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	d = parseDOM(t, rec.Body)
	assert.Contains(t, text(d.byID("trust-policy")), "No policy source: every workload trusts every federated trust domain")
	assert.Contains(t, text(d.byID("trust-policy")), "every workload (no rule names it; default allow)")

	// A server that predates policies: no panel.
	s.TrustPolicy = nil
	rec = serve(t, Handler(func() api.Snapshot { return s }, nil), http.MethodGet)
	assert.Nil(t, parseDOM(t, rec.Body).byID("trust-policy"))
}

func TestSegments(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", []string{""}},
		{"spiffe://west.example", []string{"spiffe://", "west.example"}},
		{"spiffe://west.example/trustbridge/bundle-endpoint", []string{"spiffe://", "west.example/", "trustbridge/", "bundle-endpoint"}},
		{"https://127.0.0.1:8443/", []string{"https://", "127.0.0.1:8443/", ""}},
		{"ns/*", []string{"ns/", "*"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) { assert.Equal(t, tt.want, segments(tt.in)) })
	}
}

// TestPageLongColumns checks that a 10-digit sequence and a long SPIFFE ID
// cannot wrap mid-word: the sequence cell never wraps (td.seq, nowrap),
// and the ID is one inline block per path segment, which breaks inside
// only when it alone is wider than the cell (TestChromiumLongColumns
// measures the layout).
func TestPageLongColumns(t *testing.T) {
	s, fs := longColumnsSnapshot()
	rec := serve(t, Handler(func() api.Snapshot { return s }, func(api.Snapshot) []api.Finding { return fs }), http.MethodGet)
	require.Equal(t, http.StatusOK, rec.Code)
	d := parseDOM(t, rec.Body)

	cells := d.withClass("seq")
	require.NotEmpty(t, cells)
	assert.Contains(t, collectText(cells), "1234567890")
	assert.Regexp(t, `td\.seq \{ white-space: nowrap; \}`, pageSource)

	ids := d.withClass("spiffe-id")
	require.NotEmpty(t, ids)
	for _, n := range ids {
		if text(n) != longID {
			continue
		}
		var pieces []string
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			require.Equal(t, html.ElementNode, c.Type)
			if c.Data == "span" {
				assert.True(t, hasClass(c, "seg"))
				pieces = append(pieces, text(c))
			} else {
				assert.Equal(t, "wbr", c.Data)
			}
		}
		assert.Equal(t, []string{"spiffe://", "partner-bank.example/", "trustbridge/", "regions/", "eu-west/", "bundle-endpoint"}, pieces)
		return
	}
	t.Fatalf("no SPIFFE ID cell shows %s", longID)
}

const longID = "spiffe://partner-bank.example/trustbridge/regions/eu-west/bundle-endpoint"

// longColumnsSnapshot is the realistic page with a 10-digit sequence and
// a long endpoint SPIFFE ID on every https_spiffe peer.
func longColumnsSnapshot() (api.Snapshot, []api.Finding) {
	s, fs := realisticSnapshot()
	var seq uint64 = 1234567890
	for i := range s.TrustDomains {
		if f := s.TrustDomains[i].Federation; f != nil && f.EndpointSPIFFEID != "" {
			f.EndpointSPIFFEID, s.TrustDomains[i].Sequence = longID, &seq
		}
	}
	return s, fs
}

func collectText(ns []*html.Node) string {
	var b strings.Builder
	for _, n := range ns {
		b.WriteString(text(n) + " ")
	}
	return b.String()
}
