package admin

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func spiffeEntry(t *testing.T, td string) string {
	t.Helper()
	doc, err := json.Marshal(map[string]any{"federation": []any{map[string]any{
		"trustDomain": td, "bundleEndpointURL": "https://" + td + ":8443/",
		"bundleEndpointProfile": map[string]any{"type": "https_spiffe", "endpointSPIFFEID": "spiffe://" + td + "/be"},
		"trustDomainBundle":     string(testca.PEM(testca.New(t, td).Cert)),
	}}})
	require.NoError(t, err)
	return string(doc)
}

// PATCH changes only the fields given; the rest, bootstrap bundle
// included, stays.
func TestUpdateRelationship(t *testing.T) {
	t.Parallel()
	f := newManagedFixture(t)
	h := New(f.cfg)
	rec := send(t, h, http.MethodPost, "/v1/federation/relationships?no_fetch", spiffeEntry(t, "east.example"), bearer...)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	bootstrap := f.m.State().Endpoints[0].BootstrapBundle
	const path = "/v1/federation/relationships/east.example?no_fetch"

	steps := []struct {
		name, target, body string
		want               string // the endpoint in force after
		msg                string
	}{
		{"url", path, `{"endpoint_url":"https://east2.example:8443/"}`, "east.example|https://east2.example:8443/|spiffe://east.example/be", "updated east.example: federated by east.example|https://east2.example:8443/|spiffe://east.example/be\n"},
		{"spiffe id, as spiffe://td", "/v1/federation/relationships/spiffe:%2F%2Feast.example?no_fetch", `{"endpoint_spiffe_id":"spiffe://east.example/be2"}`, "east.example|https://east2.example:8443/|spiffe://east.example/be2", "updated east.example"},
		{"to https_web", path, `{"profile":"https_web"}`, "east.example|https://east2.example:8443/", "updated east.example"},
		{"back to https_spiffe", path, `{"profile":"https_spiffe","endpoint_spiffe_id":"spiffe://east.example/be"}`, "east.example|https://east2.example:8443/|spiffe://east.example/be", "updated east.example"},
	}
	for _, s := range steps {
		rec := send(t, h, http.MethodPatch, s.target, s.body, bearer...)
		require.Equal(t, http.StatusOK, rec.Code, s.name+": "+rec.Body.String())
		assert.Contains(t, rec.Body.String(), s.msg, s.name)
		eps := f.m.State().Endpoints
		require.Len(t, eps, 1)
		assert.Equal(t, s.want, eps[0].String(), s.name)
		assert.True(t, eps[0].BootstrapBundle.Equal(bootstrap), s.name+": the bootstrap bundle kept")
	}

	next := testca.New(t, "east.example")
	body, err := json.Marshal(map[string]string{"trust_domain_bundle": string(testca.PEM(next.Cert))})
	require.NoError(t, err)
	rec = send(t, h, http.MethodPatch, path, string(body), bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.True(t, f.m.State().Endpoints[0].BootstrapBundle.Equal(next.Bundle()), "the bootstrap bundle replaced")
}

func TestUpdateRefusals(t *testing.T) {
	t.Parallel()
	f := newManagedFixture(t)
	h := New(f.cfg)
	rec := send(t, h, http.MethodPost, "/v1/federation/relationships?no_fetch", webEntry("web.example"), bearer...)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	rec = send(t, h, http.MethodPut, "/v1/bundles/static.example", string(testca.PEM(testca.New(t, "static.example").Cert)), bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	before := f.m.State()
	const web = "/v1/federation/relationships/web.example?no_fetch"
	tests := []struct {
		name, target, body string
		want               int
		msg                string
	}{
		{"unknown field", web, `{"endpoint":"https://x/"}`, http.StatusBadRequest, `relationship update: json: unknown field "endpoint"`},
		{"two values", web, `{"profile":"https_web"}{}`, http.StatusBadRequest, "relationship update: more than one JSON value"},
		{"empty", web, `{}`, http.StatusBadRequest, "relationship update: it changes nothing: give at least one of endpoint_url, profile, endpoint_spiffe_id, trust_domain_bundle"},
		{"not JSON", web, `endpoint_url: x`, http.StatusBadRequest, "relationship update: invalid character"},
		{"bad profile", web, `{"profile":"https"}`, http.StatusBadRequest, `invalid change: profile "https": want https_web or https_spiffe`},
		{"https_spiffe without an ID", web, `{"profile":"https_spiffe"}`, http.StatusBadRequest, "invalid change: profile https_spiffe needs the endpoint's SPIFFE ID: give endpoint_spiffe_id (--endpoint-spiffe-id)"},
		{"web with an ID", web, `{"profile":"https_web","endpoint_spiffe_id":"spiffe://web.example/x"}`, http.StatusBadRequest, "profile https_web authenticates the endpoint by Web PKI, without an endpoint SPIFFE ID: give one or the other"},
		{"bad URL", web, `{"endpoint_url":"http://web.example/"}`, http.StatusBadRequest, `invalid change: endpoint_url "http://web.example/": scheme must be https`},
		{"bad bundle", web, `{"trust_domain_bundle":"{"}`, http.StatusBadRequest, "invalid change: trust_domain_bundle: document is empty or truncated"},
		{"spiffe, no bundle to anchor it", web, `{"endpoint_spiffe_id":"spiffe://web.example/be"}`, http.StatusBadRequest, "no bundle to authenticate the first fetch"},
		{"configured in a file", "/v1/federation/relationships/peer.example", `{"endpoint_url":"https://x/"}`, http.StatusConflict, "peer.example is configured by --federation-config; change it there"},
		{"own", "/v1/federation/relationships/example.org", `{"endpoint_url":"https://x/"}`, http.StatusBadRequest, "own trust domain"},
		{"static bundle", "/v1/federation/relationships/static.example", `{"endpoint_url":"https://x/"}`, http.StatusNotFound, "static.example has a static bundle (bundle set) and no endpoint to update"},
		{"unknown", "/v1/federation/relationships/nope.example", `{"endpoint_url":"https://x/"}`, http.StatusNotFound, "nope.example has no endpoint added at run time"},
		{"bad name", "/v1/federation/relationships/spiffe:%2F%2Fa%2Fb", `{"endpoint_url":"https://x/"}`, http.StatusBadRequest, `trust domain "spiffe://a/b": is a SPIFFE ID with a path`},
		{"too large", web, strings.Repeat(" ", maxMutationBody+1), http.StatusRequestEntityTooLarge, "request body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := send(t, h, http.MethodPatch, tt.target, tt.body, bearer...)
			assert.Equal(t, tt.want, rec.Code)
			assert.Contains(t, body(t, rec), tt.msg)
			assert.Equal(t, before, f.m.State(), "nothing changed")
		})
	}
}

func TestDeleteBundle(t *testing.T) {
	t.Parallel()
	f := newManagedFixture(t)
	h := New(f.cfg)
	rec := send(t, h, http.MethodPost, "/v1/federation/relationships?no_fetch", webEntry("web.example"), bearer...)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	rec = send(t, h, http.MethodPut, "/v1/bundles/static.example", string(testca.PEM(testca.New(t, "static.example").Cert)), bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	before := f.m.State()
	for _, tt := range []struct {
		td   string
		want int
		msg  string
	}{
		{"web.example", http.StatusConflict, "web.example is federated by its endpoint web.example|https://web.example/ (added at run time), where its bundle comes from: stop federating with it with trustbridge federation remove"},
		{"example.org", http.StatusBadRequest, "example.org is this server's own trust domain; its bundle comes from our CA"},
		{"peer.example", http.StatusConflict, "peer.example is configured by --federation-config; change it there"},
		{"nope.example", http.StatusNotFound, "nope.example has no bundle set at run time with bundle set (see trustbridge bundle list)"},
		{"NOPE", http.StatusBadRequest, `trust domain "NOPE"`},
	} {
		rec := send(t, h, http.MethodDelete, "/v1/bundles/"+tt.td, "", bearer...)
		assert.Equal(t, tt.want, rec.Code, tt.td)
		assert.Contains(t, body(t, rec), tt.msg, tt.td)
		assert.Equal(t, before, f.m.State(), tt.td)
	}
	rec = send(t, h, http.MethodDelete, "/v1/bundles/spiffe:%2F%2Fstatic.example", "", bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, "deleted static.example's static bundle; it is no longer trusted\n", rec.Body.String())
	assert.Empty(t, f.m.State().Bundles)
	assert.Len(t, f.m.State().Endpoints, 1)
}
