package admin

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

func TestBundleFetchers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		fetchers func() []api.BundleFetcher
		code     int
		want     []api.BundleFetcher
		message  string
	}{
		{name: "no bundle endpoint", code: http.StatusNotFound, message: "this server has no bundle endpoint"},
		{name: "nobody fetched yet", code: http.StatusOK, want: []api.BundleFetcher{},
			fetchers: func() []api.BundleFetcher { return nil }},
		{name: "sorted by client", code: http.StatusOK,
			fetchers: func() []api.BundleFetcher {
				return []api.BundleFetcher{
					{Client: "198.51.100.9", UserAgent: "spire-server", LastFetch: t0, Sequence: 7},
					{Client: "192.0.2.7", LastFetch: t0.Add(-time.Hour), Sequence: 5},
				}
			},
			want: []api.BundleFetcher{
				{Client: "192.0.2.7", LastFetch: t0.Add(-time.Hour), Sequence: 5},
				{Client: "198.51.100.9", UserAgent: "spire-server", LastFetch: t0, Sequence: 7},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.cfg.Fetchers = tc.fetchers
			rec := do(t, New(f.cfg), http.MethodGet, "/v1/bundle/fetchers")
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			if tc.code != http.StatusOK {
				assert.Contains(t, rec.Body.String(), tc.message)
				return
			}
			assert.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
			var got api.BundleFetchers
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
			assert.Equal(t, localTD.Name(), got.TrustDomain)
			assert.Equal(t, tc.want, got.Fetchers)
		})
	}
	// Read-only: nothing else is routed there.
	f := newFixture(t)
	f.cfg.Fetchers = func() []api.BundleFetcher { return nil }
	assert.Equal(t, http.StatusMethodNotAllowed, do(t, New(f.cfg), http.MethodPost, "/v1/bundle/fetchers").Code)
}
