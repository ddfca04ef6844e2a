package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn/oidc"
)

// GET /v1/authn/issuers shows each issuer and the state of its keys: one
// that never fetched has no times, a failing one its error next to the
// keys it kept. Without issuers the route is not mounted.
func TestServeIssuers(t *testing.T) {
	at := time.Date(2026, 11, 25, 4, 0, 0, 0, time.FixedZone("x", 3600))
	h := New(Config{CA: newFakeCA(t), Issuers: func() []oidc.IssuerStatus {
		return []oidc.IssuerStatus{
			{Name: "ci", Kind: oidc.KindOIDC, Issuer: "https://ci.example"},
			{Name: "west", Kind: oidc.KindKubernetes, Issuer: "https://west.example", Keys: 2,
				LastFetch: at.Add(time.Minute), LastSuccess: at, LastError: "GET https://west.example/jwks: HTTP status 503"},
		}
	}})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/authn/issuers", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var got struct {
		Issuers []map[string]any `json:"issuers"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Len(t, got.Issuers, 2)
	assert.Equal(t, map[string]any{"name": "ci", "kind": "oidc", "issuer": "https://ci.example", "keys": 0.0}, got.Issuers[0])
	assert.Equal(t, map[string]any{"name": "west", "kind": "kubernetes", "issuer": "https://west.example", "keys": 2.0,
		"last_fetch": "2026-11-25T03:01:00Z", "last_success": "2026-11-25T03:00:00Z",
		"last_error": "GET https://west.example/jwks: HTTP status 503"}, got.Issuers[1])

	rec = httptest.NewRecorder()
	New(Config{CA: newFakeCA(t)}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/authn/issuers", nil))
	assert.Equal(t, http.StatusNotFound, rec.Code)
}
