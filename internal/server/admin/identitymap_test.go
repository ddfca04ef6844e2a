package admin

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

func TestIdentityExplain(t *testing.T) {
	f := newFixture(t)
	f.cfg.IdentityMap = testIdentityMap(t)
	h := New(f.cfg)
	explain := func(query string) (int, api.IdentityExplanation, string) {
		rec := do(t, h, http.MethodGet, "/v1/identity/explain?"+query)
		var ex api.IdentityExplanation
		if rec.Code == http.StatusOK {
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ex))
		}
		return rec.Code, ex, rec.Body.String()
	}
	// A pod of a conflicting pair gets nothing, and the explanation says
	// which rules.
	code, ex, _ := explain("namespace=pay&service_account=api&label=app=checkout")
	require.Equal(t, http.StatusOK, code)
	assert.Empty(t, ex.SPIFFEID)
	assert.Equal(t, "conflict: rules that select this workload give it different SPIFFE IDs", ex.Because)
	assert.Len(t, ex.Matched, 2)
	// A pod no rule selects gets the default; the uid rule never selects
	// a pod as the server sees it.
	code, ex, _ = explain("namespace=misc&service_account=tool")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "spiffe://example.org/ns/misc/sa/tool", ex.SPIFFEID)
	assert.Equal(t, "default istio: no rule selects this workload", ex.Because)

	for query, want := range map[string]string{
		"namespace=pay": "namespace and service_account are required",
		"namespace=pay&service_account=a&label=app":                          `label "app": want key=value`,
		"namespace=pay&service_account=a&label=-x=y":                         "want key=value with a valid label key",
		"namespace=" + strings.Repeat("a", 2049) + "&service_account=a":      "namespace: longer than 2048 bytes",
		"namespace=pay&service_account=a" + strings.Repeat("&label=a=b", 65): "label: more than 64",
	} {
		code, _, body := explain(query)
		assert.Equal(t, http.StatusBadRequest, code, query)
		assert.Contains(t, body, want, query)
	}
}

// Without an identity map there is no endpoint and no snapshot field.
func TestNoIdentityMap(t *testing.T) {
	f := newFixture(t)
	h := New(f.cfg)
	assert.Equal(t, http.StatusNotFound, do(t, h, http.MethodGet, "/v1/identity/explain?namespace=a&service_account=b").Code)
	assert.Nil(t, h.Snapshot().IdentityMap)
}
