package bundleserver_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// do runs one request through h and returns the recorded response.
func do(h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestNewRejectsBadConfig(t *testing.T) {
	src := newSource(nil)
	for _, tc := range []struct {
		name string
		cfg  bundleserver.Config
		want string
	}{
		{"no trust domain", bundleserver.Config{Local: src}, "trust domain is required"},
		{"no source", bundleserver.Config{TrustDomain: td}, "source is required"},
		{"relative path", bundleserver.Config{TrustDomain: td, Local: src, Path: "bundle"}, `must start with "/"`},
		{"bundle map path", bundleserver.Config{TrustDomain: td, Local: src, Path: "/bundle-map"}, "collides"},
		{"under bundles", bundleserver.Config{TrustDomain: td, Local: src, Path: "/bundles/example.org"}, "collides"},
		{"bundles dir", bundleserver.Config{TrustDomain: td, Local: src, Path: "/bundles/"}, "collides"},
		{"unclean", bundleserver.Config{TrustDomain: td, Local: src, Path: "/a/../b"}, "not clean"},
		{"double slash", bundleserver.Config{TrustDomain: td, Local: src, Path: "//b"}, "not clean"},
		{"route variable", bundleserver.Config{TrustDomain: td, Local: src, Path: "/{td}"}, "must not contain"},
		{"query", bundleserver.Config{TrustDomain: td, Local: src, Path: "/b?x=1"}, "must not contain"},
		{"space", bundleserver.Config{TrustDomain: td, Local: src, Path: "/a b"}, "must not contain"},
		{"negative hint", bundleserver.Config{TrustDomain: td, Local: src, RefreshHint: -time.Second}, "negative"},
		{"negative timeout", bundleserver.Config{TrustDomain: td, Local: src, Timeouts: bundleserver.Timeouts{Write: -1}}, "write timeout"},
		{"negative streams", bundleserver.Config{TrustDomain: td, Local: src, MaxConcurrentStreams: -1}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bundleserver.New(tc.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "bundleserver: "), err.Error())
		})
	}
	for _, p := range []string{"/", "/bundle", "/.well-known/spiffe-bundle", "/x/", "/bundles", "/bundle-map.json"} {
		_, err := bundleserver.New(bundleserver.Config{TrustDomain: td, Local: src, Path: p})
		assert.NoError(t, err, p)
	}
}

func TestServeLocalBundle(t *testing.T) {
	b := newBundle(t, td, 2, 7, time.Minute)
	s := newServer(t, bundleserver.Config{Local: newSource(b)})
	want, err := bundledoc.Marshal(b)
	require.NoError(t, err)

	get := do(s.Handler(), http.MethodGet, "/")
	require.Equal(t, http.StatusOK, get.Code)
	assert.Equal(t, string(want), get.Body.String())
	h := get.Header()
	assert.Equal(t, "application/json", h.Get("Content-Type"))
	assert.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
	assert.Equal(t, "max-age=30", h.Get("Cache-Control"), "half the 1-minute hint")
	assert.Regexp(t, `^"[0-9a-f]{32}"$`, h.Get("ETag"))
	assert.Equal(t, len(want), atoi(t, h.Get("Content-Length")))

	got, _, err := bundledoc.Parse(td, get.Body.Bytes())
	require.NoError(t, err)
	assert.True(t, b.Equal(got))

	head := do(s.Handler(), http.MethodHead, "/")
	require.Equal(t, http.StatusOK, head.Code)
	assert.Empty(t, head.Body.Bytes())
	assert.Equal(t, get.Header(), head.Header(), "HEAD carries GET's headers, Content-Length included")

	// The same document under /bundles/{td}, with the same validator.
	byName := do(s.Handler(), http.MethodGet, "/bundles/example.org")
	require.Equal(t, http.StatusOK, byName.Code)
	assert.Equal(t, string(want), byName.Body.String())
	assert.Equal(t, h.Get("ETag"), byName.Header().Get("ETag"))
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		require.True(t, c >= '0' && c <= '9', s)
		n = n*10 + int(c-'0')
	}
	return n
}

func TestConditionalGet(t *testing.T) {
	s := newServer(t, bundleserver.Config{Local: newSource(newBundle(t, td, 1, 1, 0))})
	etag := do(s.Handler(), http.MethodGet, "/").Header().Get("ETag")
	require.NotEmpty(t, etag)
	opaque := strings.Trim(etag, `"`)

	for _, tc := range []struct {
		name   string
		values []string
		want   int
	}{
		{"exact", []string{etag}, http.StatusNotModified},
		{"weak form matches (weak comparison)", []string{"W/" + etag}, http.StatusNotModified},
		{"star", []string{"*"}, http.StatusNotModified},
		{"in a list", []string{`"nope", ` + etag + `, "other"`}, http.StatusNotModified},
		{"list without spaces", []string{`"nope",W/` + etag}, http.StatusNotModified},
		{"on a second header line", []string{`"nope"`, etag}, http.StatusNotModified},
		{"comma inside another tag", []string{`"a,b", ` + etag}, http.StatusNotModified},
		{"other tag", []string{`"0123"`}, http.StatusOK},
		{"unquoted", []string{opaque}, http.StatusOK},
		{"prefix only", []string{`"` + opaque[:8] + `"`}, http.StatusOK},
		{"malformed before", []string{`garbage, ` + etag}, http.StatusOK},
		{"unterminated", []string{`"` + opaque}, http.StatusOK},
		{"empty", []string{""}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{http.MethodGet, http.MethodHead} {
				var hdr []string
				for _, v := range tc.values {
					hdr = append(hdr, "If-None-Match", v)
				}
				w := do(s.Handler(), method, "/", hdr...)
				require.Equal(t, tc.want, w.Code, method)
				assert.Equal(t, etag, w.Header().Get("ETag"))
				assert.NotEmpty(t, w.Header().Get("Cache-Control"))
				if tc.want == http.StatusNotModified {
					assert.Empty(t, w.Body.Bytes())
					assert.Empty(t, w.Header().Get("Content-Length"))
				}
			}
		})
	}

	// A new bundle changes the validator: the old one no longer matches.
	s2 := newServer(t, bundleserver.Config{Local: newSource(newBundle(t, td, 1, 2, 0))})
	assert.Equal(t, http.StatusOK, do(s2.Handler(), http.MethodGet, "/", "If-None-Match", etag).Code)
}

func TestMethodsAndUnknownPaths(t *testing.T) {
	s := newServer(t, bundleserver.Config{Local: newSource(newBundle(t, td, 1, 1, 0)), Path: "/bundle"})
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions, http.MethodPatch, "BREW"} {
		for _, target := range []string{"/bundle", "/bundles/example.org", "/bundle-map"} {
			w := do(s.Handler(), method, target)
			assert.Equal(t, http.StatusMethodNotAllowed, w.Code, method+" "+target)
			assert.Equal(t, "GET, HEAD", w.Header().Get("Allow"))
		}
	}
	for _, target := range []string{
		"/", "/bundle/", "/bundlex", "/bundles", "/bundles/", "/bundles/unknown.example",
		"/bundles/EXAMPLE.ORG", "/bundles/example.org.", "/bundles/spiffe:%2F%2Fexample.org",
		"/bundles/example.org/x", "/bundle-map/", "//bundle", "/./bundle",
	} {
		w := do(s.Handler(), http.MethodGet, target)
		assert.Equal(t, http.StatusNotFound, w.Code, target)
		assert.Equal(t, "no-store", w.Header().Get("Cache-Control"), target)
		assert.NotEqual(t, "application/json", w.Header().Get("Content-Type"), target)
	}
}

func TestUnavailableUntilBundleExists(t *testing.T) {
	src := newSource(nil)
	s := newServer(t, bundleserver.Config{Local: src})
	for _, target := range []string{"/", "/bundles/example.org", "/bundle-map"} {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			w := do(s.Handler(), method, target)
			require.Equal(t, http.StatusServiceUnavailable, w.Code, target)
			assert.NotEmpty(t, w.Header().Get("Retry-After"))
			assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
			assert.Empty(t, w.Header().Get("ETag"))
			// go-spiffe ignores status codes: the body must not parse as
			// a bundle, let alone as an empty one.
			_, err := spiffebundle.Parse(td, w.Body.Bytes())
			assert.Error(t, err)
		}
	}
	// If-None-Match "*" must not turn "nothing to serve" into 304.
	assert.Equal(t, http.StatusServiceUnavailable, do(s.Handler(), http.MethodGet, "/", "If-None-Match", "*").Code)

	b := newBundle(t, td, 1, 1, 0)
	src.Set(b)
	assert.Equal(t, http.StatusServiceUnavailable, do(s.Handler(), http.MethodGet, "/").Code, "visible only after Update")
	require.NoError(t, s.Update())
	assert.Equal(t, http.StatusOK, do(s.Handler(), http.MethodGet, "/").Code)
	assert.Equal(t, http.StatusOK, do(s.Handler(), http.MethodGet, "/bundle-map").Code)

	// A source that loses its bundle keeps the last one served.
	src.Set(nil)
	require.NoError(t, s.Update())
	assert.Equal(t, http.StatusOK, do(s.Handler(), http.MethodGet, "/").Code)
}

func TestRefusedLocalBundles(t *testing.T) {
	good := newBundle(t, td, 1, 1, 0)
	empty := spiffebundle.New(td)
	empty.SetSequenceNumber(2)
	foreign := newBundle(t, eastTD, 1, 3, 0)

	t.Run("empty without a previous bundle is unavailable", func(t *testing.T) {
		s, err := bundleserver.New(bundleserver.Config{TrustDomain: td, Local: newSource(empty)})
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, do(s.Handler(), http.MethodGet, "/").Code)
		err = s.Update()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no keys")
	})
	for _, bad := range []struct {
		name string
		b    *spiffebundle.Bundle
		want string
	}{{"empty", empty, "no keys"}, {"foreign", foreign, `trust domain "east.example"`}} {
		t.Run(bad.name+" keeps the last good document", func(t *testing.T) {
			src := newSource(good)
			reg := prometheus.NewRegistry()
			s := newServer(t, bundleserver.Config{Local: src, Registerer: reg})
			before := do(s.Handler(), http.MethodGet, "/")
			src.Set(bad.b)
			err := s.Update()
			require.Error(t, err)
			assert.Contains(t, err.Error(), bad.want)
			after := do(s.Handler(), http.MethodGet, "/")
			assert.Equal(t, before.Body.String(), after.Body.String())
			require.Error(t, s.Update(), "still refused")
			assert.Equal(t, float64(1), metricValue(t, reg, "trustbridge_bundleserver_update_errors_total"), "counted once")
		})
	}
	t.Run("AllowEmpty serves keys []", func(t *testing.T) {
		s := newServer(t, bundleserver.Config{Local: newSource(empty), AllowEmpty: true})
		w := do(s.Handler(), http.MethodGet, "/")
		require.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, `{"keys":[],"spiffe_sequence":2}`, w.Body.String())
	})
}

func TestRefreshHintAndCacheControl(t *testing.T) {
	for _, tc := range []struct {
		name        string
		bundleHint  time.Duration
		configHint  time.Duration
		wantHint    string
		wantControl string
	}{
		{"bundle hint kept", time.Minute, time.Hour, `"spiffe_refresh_hint":60}`, "max-age=30"},
		{"config hint fills in", 0, 10 * time.Minute, `"spiffe_refresh_hint":600}`, "max-age=300"},
		{"long hint is capped", 24 * time.Hour, 0, `"spiffe_refresh_hint":86400}`, "max-age=300"},
		{"no hint at all", 0, 0, "", "max-age=150"},
		{"tiny hint", time.Second, 0, `"spiffe_refresh_hint":1}`, "max-age=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBundle(t, td, 1, 1, tc.bundleHint)
			s := newServer(t, bundleserver.Config{Local: newSource(b), RefreshHint: tc.configHint})
			w := do(s.Handler(), http.MethodGet, "/")
			require.Equal(t, http.StatusOK, w.Code)
			if tc.wantHint == "" {
				assert.NotContains(t, w.Body.String(), "spiffe_refresh_hint")
			} else {
				assert.True(t, strings.HasSuffix(w.Body.String(), tc.wantHint), w.Body.String())
			}
			assert.Equal(t, tc.wantControl, w.Header().Get("Cache-Control"))
			_, hasHint := b.RefreshHint()
			assert.Equal(t, tc.bundleHint != 0, hasHint, "the source's bundle is not modified")
		})
	}
}

func TestOtherBundles(t *testing.T) {
	local := newBundle(t, td, 1, 5, time.Minute)
	east := newBundle(t, eastTD, 2, 9, 10*time.Minute)
	west := newBundle(t, westTD, 1, 0, 0)
	shadow := newBundle(t, td, 1, 99, 0) // a federated copy of ourselves
	others := func() []*spiffebundle.Bundle { return []*spiffebundle.Bundle{east, shadow, nil, west} }

	t.Run("served", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		s := newServer(t, bundleserver.Config{Local: newSource(local), Others: others, ServeOthers: true, Registerer: reg})
		for _, b := range []*spiffebundle.Bundle{local, east, west} {
			w := do(s.Handler(), http.MethodGet, "/bundles/"+b.TrustDomain().Name())
			require.Equal(t, http.StatusOK, w.Code, b.TrustDomain())
			got, _, err := bundledoc.Parse(b.TrustDomain(), w.Body.Bytes())
			require.NoError(t, err)
			assert.True(t, b.Equal(got), b.TrustDomain())
		}
		assert.Equal(t, "max-age=300", do(s.Handler(), http.MethodGet, "/bundles/east.example").Header().Get("Cache-Control"))

		w := do(s.Handler(), http.MethodGet, "/bundle-map")
		require.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
		assert.Equal(t, "max-age=30", w.Header().Get("Cache-Control"), "the shortest member's")
		assert.NotContains(t, w.Body.String(), "spiffe_refresh_hint")
		bundles, warnings, err := bundledoc.ParseMap(w.Body.Bytes())
		require.NoError(t, err)
		assert.Empty(t, warnings)
		require.Len(t, bundles, 3)
		for i, want := range []*spiffebundle.Bundle{east, local, west} { // sorted by name
			assert.Equal(t, want.TrustDomain(), bundles[i].TrustDomain())
			assert.Equal(t, want.X509Authorities(), bundles[i].X509Authorities())
		}
		assert.Equal(t, float64(9), metricValue(t, reg, "trustbridge_bundleserver_served_sequence", "trust_domain", "east.example"))
		assert.Equal(t, float64(5), metricValue(t, reg, "trustbridge_bundleserver_served_sequence", "trust_domain", "example.org"))

		// The local document is never replaced by another's copy.
		assert.NotContains(t, do(s.Handler(), http.MethodGet, "/").Body.String(), `"spiffe_sequence":99`)
	})
	t.Run("hidden without ServeOthers", func(t *testing.T) {
		s := newServer(t, bundleserver.Config{Local: newSource(local), Others: others})
		assert.Equal(t, http.StatusNotFound, do(s.Handler(), http.MethodGet, "/bundles/east.example").Code)
		assert.Equal(t, http.StatusOK, do(s.Handler(), http.MethodGet, "/bundles/example.org").Code)
		bundles, _, err := bundledoc.ParseMap(do(s.Handler(), http.MethodGet, "/bundle-map").Body.Bytes())
		require.NoError(t, err)
		require.Len(t, bundles, 1)
		assert.Equal(t, td, bundles[0].TrustDomain())
	})
	t.Run("duplicates and removals", func(t *testing.T) {
		east2 := withRoot(t, east)
		list := []*spiffebundle.Bundle{east, east2}
		s := newServer(t, bundleserver.Config{Local: newSource(local), ServeOthers: true,
			Others: func() []*spiffebundle.Bundle { return list }})
		err := s.Update()
		require.Error(t, err)
		assert.Contains(t, err.Error(), `"east.example": more than one bundle`)
		assert.Contains(t, do(s.Handler(), http.MethodGet, "/bundles/east.example").Body.String(), `"spiffe_sequence":9`)

		list = []*spiffebundle.Bundle{east2}
		require.NoError(t, s.Update())
		assert.Contains(t, do(s.Handler(), http.MethodGet, "/bundles/east.example").Body.String(), `"spiffe_sequence":10`)
		list = nil
		require.NoError(t, s.Update())
		assert.Equal(t, http.StatusNotFound, do(s.Handler(), http.MethodGet, "/bundles/east.example").Code)
		bundles, _, err := bundledoc.ParseMap(do(s.Handler(), http.MethodGet, "/bundle-map").Body.Bytes())
		require.NoError(t, err)
		assert.Len(t, bundles, 1)
	})
}

// metricValue is the value of the series name{labels...} in reg; 0 when
// absent.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func TestUpdateReusesUnchangedDocuments(t *testing.T) {
	b := newBundle(t, td, 1, 1, 0)
	src := newSource(b)
	s := newServer(t, bundleserver.Config{Local: src})
	etag := do(s.Handler(), http.MethodGet, "/").Header().Get("ETag")
	require.NoError(t, s.Update())
	src.Set(b.Clone()) // equal content, new pointer
	require.NoError(t, s.Update())
	assert.Equal(t, etag, do(s.Handler(), http.MethodGet, "/").Header().Get("ETag"))

	src.Set(withRoot(t, b))
	require.NoError(t, s.Update())
	assert.NotEqual(t, etag, do(s.Handler(), http.MethodGet, "/").Header().Get("ETag"))
}

func TestRequestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newServer(t, bundleserver.Config{Local: newSource(newBundle(t, td, 1, 1, 0)), Registerer: reg})
	etag := do(s.Handler(), http.MethodGet, "/").Header().Get("ETag")
	do(s.Handler(), http.MethodGet, "/", "If-None-Match", etag)
	do(s.Handler(), http.MethodPost, "/bundle-map")
	do(s.Handler(), http.MethodGet, "/nope")
	do(s.Handler(), http.MethodGet, "/bundles/unknown.example")

	for _, tc := range []struct {
		route, code string
		want        float64
	}{
		{"local", "200", 1}, {"local", "304", 1}, {"bundle_map", "405", 1}, {"none", "404", 1},
		{"bundles", "404", 1}, {"bundles", "200", 0},
	} {
		got := metricValue(t, reg, "trustbridge_bundleserver_requests_total", "route", tc.route, "code", tc.code)
		assert.Equal(t, tc.want, got, tc.route+" "+tc.code)
	}
	_, err := bundleserver.New(bundleserver.Config{TrustDomain: td, Local: newSource(nil), Registerer: reg})
	assert.Error(t, err, "metrics are registered once per registry")
}
