package oidc

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn/oidc/oidctest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// ksFixture is a key set of a test issuer, on a fake clock, with its
// logs and metrics at hand.
type ksFixture struct {
	iss     *oidctest.Issuer
	clk     *clocktesting.FakeClock
	ks      *keySet
	logs    *testlog.Buffer
	metrics *keyMetrics
}

func newKSFixture(t *testing.T, iss *oidctest.Issuer, mutate ...func(*keySetConfig)) *ksFixture {
	t.Helper()
	fx := &ksFixture{iss: iss, clk: clocktesting.NewFakeClock(t0), logs: testlog.JSONLines(t)}
	var err error
	fx.metrics, err = newKeyMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	cfg := keySetConfig{
		name: "test", issuer: iss.URL(), roots: iss.Roots(), allowPrivate: true, clock: fx.clk, metrics: fx.metrics,
		logger: slog.New(slog.NewJSONHandler(fx.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	fx.ks, err = newKeySet(cfg)
	require.NoError(t, err)
	return fx
}

func (fx *ksFixture) hits(p string) int { return fx.iss.Hits()[fx.iss.Path(p)] }

func (fx *ksFixture) fetches(result string) float64 {
	return testutil.ToFloat64(fx.metrics.fetches.WithLabelValues("test", result))
}

func (fx *ksFixture) logLines(level string) []string {
	var out []string
	for _, l := range strings.Split(fx.logs.String(), "\n") {
		if strings.Contains(l, `"level":"`+level+`"`) {
			out = append(out, l)
		}
	}
	return out
}

func kids(keys []jose.JSONWebKey) []string {
	var out []string
	for _, k := range keys {
		out = append(out, k.KeyID)
	}
	return out
}

func TestNewKeySetChecksIssuer(t *testing.T) {
	t.Parallel()
	tests := []struct{ issuer, err string }{
		{"https://issuer.example", ""},
		{"https://issuer.example/tenant/", ""},
		{"http://issuer.example", "scheme must be https"},
		{"https:///path", "host is missing"},
		{"https://user:pw@issuer.example", "userinfo"},
		{"https://issuer.example?x=1", "query"},
		{"https://issuer.example?", "query"},
		{"https://issuer.example#frag", "fragment"},
		{"https://issuer.example#", "fragment"},
		{"issuer.example", "scheme must be https"},
		{"https://[::1", "issuer URL"},
	}
	for _, tt := range tests {
		t.Run(tt.issuer, func(t *testing.T) {
			_, err := newKeySet(keySetConfig{name: "x", issuer: tt.issuer})
			if tt.err == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.err)
			assert.NotContains(t, err.Error(), "pw")
		})
	}
}

// Every way a fetch fails: with no keys held, tokens get
// ErrKeysUnavailable naming the cause; with good keys held, they stay in
// use and the failure shows in Status, the metric and one Warn line.
func TestKeySetFetchFailures(t *testing.T) {
	t.Parallel()
	redirect := func(to string) func(*oidctest.Issuer) {
		return func(iss *oidctest.Issuer) {
			iss.SetHandler(iss.Path(oidctest.JWKSPath), http.RedirectHandler(to, http.StatusFound))
		}
	}
	discovery := func(edit func(iss *oidctest.Issuer, d map[string]any)) func(*oidctest.Issuer) {
		return func(iss *oidctest.Issuer) {
			d := iss.Discovery()
			edit(iss, d)
			b, _ := json.Marshal(d)
			iss.SetDiscoveryBody(b)
		}
	}
	tests := []struct {
		name  string
		fault func(*oidctest.Issuer)
		err   string
	}{
		{"discovery status", func(iss *oidctest.Issuer) { iss.SetStatus(http.StatusServiceUnavailable) }, "HTTP status 503 Service Unavailable, want 200 OK"},
		{"jwks status", func(iss *oidctest.Issuer) {
			iss.SetHandler(iss.Path(oidctest.JWKSPath), http.NotFoundHandler())
		}, "/jwks: HTTP status 404"},
		{"discovery issuer differs", discovery(func(iss *oidctest.Issuer, d map[string]any) { d["issuer"] = iss.URL() + "/" }), "they must be identical"},
		{"discovery issuer missing", discovery(func(_ *oidctest.Issuer, d map[string]any) { delete(d, "issuer") }), "has no issuer"},
		{"jwks_uri http", discovery(func(iss *oidctest.Issuer, d map[string]any) {
			d["jwks_uri"] = strings.Replace(iss.URL(), "https:", "http:", 1) + "/jwks"
		}), "openid configuration jwks_uri"},
		{"jwks_uri missing", discovery(func(_ *oidctest.Issuer, d map[string]any) { delete(d, "jwks_uri") }), "has no jwks_uri"},
		{"discovery not JSON", func(iss *oidctest.Issuer) { iss.SetDiscoveryBody([]byte("<html>")) }, "openid configuration: invalid character"},
		{"discovery oversized", func(iss *oidctest.Issuer) {
			d, _ := json.Marshal(iss.Discovery())
			iss.SetDiscoveryBody(append(d, make([]byte, maxDiscoveryBytes)...))
		}, "larger than 65536 bytes"},
		{"jwks oversized", func(iss *oidctest.Issuer) {
			iss.SetJWKSBody(append(iss.JWKS(), make([]byte, maxJWKSBytes)...))
		}, "larger than 262144 bytes"},
		{"jwks no usable key", func(iss *oidctest.Issuer) {
			iss.SetJWKSBody([]byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"k"},{"kty":"AKP","kid":"pq"}]}`))
		}, "no usable public signing key"},
		{"jwks empty", func(iss *oidctest.Issuer) { iss.SetJWKSBody([]byte(`{"keys":[]}`)) }, "no usable public signing key"},
		{"redirect to http", redirect("http://127.0.0.1:1/jwks"), "scheme must be https"},
		{"redirect loop", func(iss *oidctest.Issuer) {
			iss.SetHandler(iss.Path(oidctest.JWKSPath), http.RedirectHandler(iss.URL()+"/jwks", http.StatusFound))
		}, "more than 3 redirects"},
		{"redirect to metadata", redirect("https://169.254.169.254/jwks"), "refused even with allowPrivateAddresses"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"/none held", func(t *testing.T) {
			t.Parallel()
			fx := newKSFixture(t, oidctest.New(t))
			tt.fault(fx.iss)
			_, err := fx.ks.Keys(t.Context(), "")
			require.ErrorIs(t, err, ErrKeysUnavailable)
			t.Log(err)
			assert.Contains(t, err.Error(), tt.err)
			st := fx.ks.Status()
			assert.Zero(t, st.Keys)
			assert.Contains(t, st.LastError, tt.err)
			assert.Equal(t, 1.0, fx.fetches("error"))
			assert.Len(t, fx.logLines("WARN"), 1)
			assert.Contains(t, fx.logLines("WARN")[0], "tokens are refused")
		})
		t.Run(tt.name+"/last good kept", func(t *testing.T) {
			t.Parallel()
			fx := newKSFixture(t, oidctest.New(t))
			good, err := fx.ks.Keys(t.Context(), "")
			require.NoError(t, err)
			tt.fault(fx.iss)
			for range 3 {
				fx.clk.Step(defaultKeyFreshness)
				keys, err := fx.ks.Keys(t.Context(), "")
				require.NoError(t, err)
				assert.Equal(t, kids(good), kids(keys))
			}
			st := fx.ks.Status()
			assert.Equal(t, 1, st.Keys)
			assert.Equal(t, t0, st.LastSuccess)
			assert.Equal(t, t0.Add(3*defaultKeyFreshness), st.LastFetch)
			assert.Contains(t, st.LastError, tt.err)
			assert.Equal(t, 3.0, fx.fetches("error"))
			assert.Equal(t, 1.0, testutil.ToFloat64(fx.metrics.keys.WithLabelValues("test")))
			warns := fx.logLines("WARN")
			require.Len(t, warns, 1, "one Warn per change of state")
			assert.Contains(t, warns[0], "last good keys")
			assert.Contains(t, warns[0], `"issuer":"test"`)
			assert.Contains(t, warns[0], tt.err)
		})
	}
}

// The dial guard applies: an issuer on loopback needs allowPrivate, and
// the refusal names the key that allows it. No request reaches it.
func TestKeySetRefusesLoopbackUnlessAllowed(t *testing.T) {
	t.Parallel()
	fx := newKSFixture(t, oidctest.New(t), func(c *keySetConfig) { c.allowPrivate = false })
	_, err := fx.ks.Keys(t.Context(), "")
	require.ErrorIs(t, err, ErrKeysUnavailable)
	assert.Contains(t, err.Error(), "127.0.0.1")
	assert.Contains(t, err.Error(), "is a loopback address; set allowPrivateAddresses to allow it")
	assert.Empty(t, fx.iss.Hits())
}

// A server offering less than TLS 1.2 is refused.
func TestKeySetRefusesOldTLS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11} //nolint:gosec // the point: an old server
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	ks, err := newKeySet(keySetConfig{name: "old", issuer: srv.URL, roots: roots, allowPrivate: true, clock: clocktesting.NewFakeClock(t0)})
	require.NoError(t, err)
	_, err = ks.Keys(t.Context(), "")
	require.ErrorIs(t, err, ErrKeysUnavailable)
	assert.Contains(t, err.Error(), "protocol version not supported")
}

// A redirect to https on the same guarded client is followed.
func TestKeySetFollowsHTTPSRedirect(t *testing.T) {
	t.Parallel()
	fx := newKSFixture(t, oidctest.New(t))
	fx.iss.SetHandler(fx.iss.Path("/moved"), http.RedirectHandler(fx.iss.URL()+oidctest.JWKSPath, http.StatusFound))
	d := fx.iss.Discovery()
	d["jwks_uri"] = fx.iss.URL() + "/moved"
	b, err := json.Marshal(d)
	require.NoError(t, err)
	fx.iss.SetDiscoveryBody(b)
	keys, err := fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.NoError(t, err)
	assert.Len(t, keys, 1)
	assert.Equal(t, 1, fx.hits("/moved"))
	assert.Equal(t, 1, fx.hits(oidctest.JWKSPath))
}

// An issuer that serves its key set only as application/jwk-set+json,
// as kube-apiserver does (406 to a client that accepts only JSON), is
// read.
func TestKeySetAcceptsJWKSetMediaType(t *testing.T) {
	t.Parallel()
	fx := newKSFixture(t, oidctest.New(t))
	jwks := fx.iss.JWKS()
	fx.iss.SetHandler(fx.iss.Path(oidctest.JWKSPath), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept"), "application/jwk-set+json") {
			http.Error(w, "only application/jwk-set+json", http.StatusNotAcceptable)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(jwks)
	}))
	keys, err := fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.NoError(t, err)
	assert.Len(t, keys, 1)
}

// Unknown kty, weak RSA and secret keys are skipped, one by one.
func TestKeySetSkipsUnusableKeys(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(iss.JWKS(), &set))
	weak, err := rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // the point: a weak key is skipped
	require.NoError(t, err)
	extra := []jose.JSONWebKey{{Key: &weak.PublicKey, KeyID: "weak", Use: "sig"}, {Key: []byte("0123456789abcdef"), KeyID: "oct"}}
	for _, k := range extra {
		b, err := k.MarshalJSON()
		require.NoError(t, err)
		set.Keys = append(set.Keys, b)
	}
	set.Keys = append(set.Keys, json.RawMessage(`{"kty":"AKP","alg":"ML-DSA-44","pub":"AAAA","kid":"pq"}`),
		json.RawMessage(`{"kty":"EC","crv":"P-256K","x":"AA","y":"AA","kid":"k1"}`))
	body, err := json.Marshal(set)
	require.NoError(t, err)
	iss.SetJWKSBody(body)

	fx := newKSFixture(t, iss)
	keys, err := fx.ks.Keys(t.Context(), "")
	require.NoError(t, err)
	assert.Equal(t, []string{iss.KeyID()}, kids(keys))
	for _, kid := range []string{"weak", "oct", "pq", "k1"} {
		_, err := fx.ks.Keys(t.Context(), kid)
		assert.ErrorIs(t, err, ErrUnknownKey, kid)
	}
}

func TestKeysFreshFor(t *testing.T) {
	t.Parallel()
	now := t0
	date := now.Add(-time.Hour).Format(http.TimeFormat)
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
	}{
		{"none", http.Header{}, defaultKeyFreshness},
		{"max-age", http.Header{"Cache-Control": {"public, max-age=600"}}, 10 * time.Minute},
		{"max-age minus Age", http.Header{"Cache-Control": {"max-age=600"}, "Age": {"100"}}, 500 * time.Second},
		{"bad Age ignored", http.Header{"Cache-Control": {"max-age=600"}, "Age": {"-3"}}, 10 * time.Minute},
		{"max-age over Expires", http.Header{"Cache-Control": {"max-age=600"}, "Expires": {now.Add(time.Hour).Format(http.TimeFormat)}}, 10 * time.Minute},
		{"second Cache-Control line", http.Header{"Cache-Control": {"public", "max-age=120"}}, 2 * time.Minute},
		{"no-store", http.Header{"Cache-Control": {"no-store, max-age=600"}}, 30 * time.Second},
		{"no-cache", http.Header{"Cache-Control": {"no-cache"}}, 30 * time.Second},
		{"clamped up", http.Header{"Cache-Control": {"max-age=5"}}, 30 * time.Second},
		{"clamped down", http.Header{"Cache-Control": {"max-age=31536000"}}, 24 * time.Hour},
		{"huge max-age", http.Header{"Cache-Control": {"max-age=99999999999999999999"}}, 24 * time.Hour},
		{"Age beyond max-age", http.Header{"Cache-Control": {"max-age=60"}, "Age": {"3600"}}, 30 * time.Second},
		{"Expires with Date", http.Header{"Expires": {now.Format(http.TimeFormat)}, "Date": {date}}, time.Hour},
		{"Expires without Date", http.Header{"Expires": {now.Add(20 * time.Minute).Format(http.TimeFormat)}}, 20 * time.Minute},
		{"Expires in the past", http.Header{"Expires": {now.Add(-time.Hour).Format(http.TimeFormat)}}, 30 * time.Second},
		{"Expires invalid", http.Header{"Expires": {"0"}}, 30 * time.Second},
		{"Expires far", http.Header{"Expires": {now.AddDate(1, 0, 0).Format(http.TimeFormat)}}, 24 * time.Hour},
		{"malformed max-age", http.Header{"Cache-Control": {"max-age=abc"}}, defaultKeyFreshness},
		{"unclosed quote", http.Header{"Cache-Control": {`private="x`}}, defaultKeyFreshness},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, keysFreshFor(tt.header, now, 30*time.Second))
		})
	}
}

// Freshness comes from the JWKS answer: a fresh set is not fetched
// again, a stale one is fetched on its next use.
func TestKeySetStaleRefresh(t *testing.T) {
	t.Parallel()
	fx := newKSFixture(t, oidctest.New(t, oidctest.WithMaxAge(2*time.Minute)))
	_, err := fx.ks.Keys(t.Context(), "")
	require.NoError(t, err)
	assert.Equal(t, t0.Add(2*time.Minute), fx.ks.Status().FreshUntil)

	fx.clk.Step(119 * time.Second)
	_, err = fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.NoError(t, err)
	assert.Equal(t, 1, fx.hits(oidctest.JWKSPath), "fresh: no fetch")

	fx.clk.Step(time.Second)
	_, err = fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.NoError(t, err)
	assert.Equal(t, 2, fx.hits(oidctest.JWKSPath), "stale: fetched on use")
	assert.Equal(t, 2, fx.hits(oidctest.DiscoveryPath))
	assert.Equal(t, 2.0, fx.fetches("ok"))
	assert.Equal(t, float64(t0.Add(2*time.Minute).Unix()), testutil.ToFloat64(fx.metrics.lastSuccess.WithLabelValues("test")))
	assert.Len(t, fx.logLines("INFO"), 1, "only the first fetch is news")
}

// Tokens with unknown kids cause at most one fetch per refresh interval,
// however many arrive.
func TestKeySetUnknownKidRateLimit(t *testing.T) {
	t.Parallel()
	fx := newKSFixture(t, oidctest.New(t, oidctest.WithMaxAge(time.Hour)))
	_, err := fx.ks.Keys(t.Context(), "")
	require.NoError(t, err)
	for step := range 4 {
		for i := range 10 {
			_, err := fx.ks.Keys(t.Context(), "junk-"+string(rune('a'+i)))
			require.ErrorIs(t, err, ErrUnknownKey)
			assert.Contains(t, err.Error(), "refetched for an unknown key id at most every 30s")
		}
		assert.Equal(t, 1+step, fx.hits(oidctest.JWKSPath), "step %d", step)
		fx.clk.Step(defaultKeyRefreshInterval)
	}
	long := strings.Repeat("k", 500)
	_, err = fx.ks.Keys(t.Context(), long)
	require.ErrorIs(t, err, ErrUnknownKey)
	assert.NotContains(t, err.Error(), long, "a token's kid is clipped in errors")
}

// A key rotated in is picked up by the refetch its first token causes;
// a key dropped from the set is gone after the next fetch.
func TestKeySetRotation(t *testing.T) {
	t.Parallel()
	fx := newKSFixture(t, oidctest.New(t, oidctest.WithMaxAge(time.Hour)))
	old := fx.iss.KeyID()
	_, err := fx.ks.Keys(t.Context(), old)
	require.NoError(t, err)

	fx.iss.Rotate()
	_, err = fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.ErrorIs(t, err, ErrUnknownKey, "within the refresh interval of the last fetch")
	fx.clk.Step(defaultKeyRefreshInterval)
	keys, err := fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.NoError(t, err)
	assert.Equal(t, []string{fx.iss.KeyID()}, kids(keys))
	all, err := fx.ks.Keys(t.Context(), "")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{old, fx.iss.KeyID()}, kids(all))

	fx.iss.DropOldKeys()
	fx.clk.Step(time.Hour)
	_, err = fx.ks.Keys(t.Context(), old)
	require.ErrorIs(t, err, ErrUnknownKey)
	assert.Equal(t, 1, fx.ks.Status().Keys)
}

// Failing fetches keep the last good keys for maxKeyAge after the last
// success, then tokens are refused (fail closed) until a fetch succeeds.
func TestKeySetMaxKeyAge(t *testing.T) {
	t.Parallel()
	fx := newKSFixture(t, oidctest.New(t), func(c *keySetConfig) { c.maxKeyAge = time.Hour })
	_, err := fx.ks.Keys(t.Context(), "")
	require.NoError(t, err)
	fx.iss.SetStatus(http.StatusInternalServerError)

	fx.clk.Step(time.Hour - time.Second)
	_, err = fx.ks.Keys(t.Context(), "")
	require.NoError(t, err, "within maxKeyAge")

	fx.clk.Step(time.Second)
	_, err = fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.ErrorIs(t, err, ErrKeysUnavailable)
	assert.Contains(t, err.Error(), "older than 1h0m0s")
	assert.Contains(t, err.Error(), "500 Internal Server Error")
	assert.Zero(t, fx.ks.Status().Keys)
	assert.Zero(t, testutil.ToFloat64(fx.metrics.keys.WithLabelValues("test")))
	warns := fx.logLines("WARN")
	require.Len(t, warns, 2, "kept, then unavailable")
	assert.Contains(t, warns[1], "tokens are refused")

	fx.clk.Step(time.Second)
	_, err = fx.ks.Keys(t.Context(), "")
	require.ErrorIs(t, err, ErrKeysUnavailable, "no fetch allowed yet")
	assert.Len(t, fx.logLines("WARN"), 2)

	fx.iss.SetStatus(0)
	fx.clk.Step(defaultKeyRefreshInterval)
	_, err = fx.ks.Keys(t.Context(), fx.iss.KeyID())
	require.NoError(t, err)
	infos := fx.logLines("INFO")
	require.Len(t, infos, 2)
	assert.Contains(t, infos[1], "fetched again")
	assert.Empty(t, fx.ks.Status().LastError)
}

// Callers that need keys while a fetch is in flight wait for it; one
// fetch serves them all. A caller whose context ends stops waiting.
func TestKeySetSingleFlight(t *testing.T) {
	t.Parallel()
	iss := oidctest.New(t)
	entered, release := make(chan struct{}), make(chan struct{})
	iss.SetHandler(iss.Path(oidctest.JWKSPath), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = w.Write(iss.JWKS())
	}))
	fx := newKSFixture(t, iss)

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := fx.ks.Keys(t.Context(), iss.KeyID())
			errs <- err
		})
	}
	<-entered
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := fx.ks.Keys(ctx, "")
	require.ErrorIs(t, err, ErrKeysUnavailable)
	assert.ErrorIs(t, err, context.Canceled)

	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.Equal(t, 1, fx.hits(oidctest.JWKSPath))
	assert.Equal(t, 1, fx.hits(oidctest.DiscoveryPath))
}

func FuzzParseDiscovery(f *testing.F) {
	const issuer = "https://issuer.example/tenant"
	for _, s := range []string{
		`{"issuer":"https://issuer.example/tenant","jwks_uri":"https://keys.example/jwks"}`,
		`{"issuer":"https://issuer.example/tenant","jwks_uri":"http://keys.example/jwks"}`,
		`{"issuer":"https://issuer.example/tenant/","jwks_uri":"https://keys.example/jwks"}`,
		`{"issuer":"https://issuer.example/tenant","jwks_uri":"https://u:p@keys.example/jwks#x"}`,
		`{"issuer":"https://issuer.example/tenant","jwks_uri":"https:///jwks"}`,
		`{"issuer":null,"jwks_uri":7}`, `[]`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		u, err := parseDiscovery(body, issuer)
		if err != nil {
			if len(err.Error()) > 2048 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if !strings.HasPrefix(u, "https://") || strings.Contains(u, "#") {
			t.Fatalf("accepted jwks_uri %q", u)
		}
		var doc struct{ Issuer string }
		if json.Unmarshal(body, &doc) != nil || doc.Issuer != issuer {
			t.Fatalf("accepted issuer %q", doc.Issuer)
		}
	})
}

func FuzzKeysFreshFor(f *testing.F) {
	for _, s := range [][2]string{{"max-age=600", ""}, {"no-store", ""}, {"", "Thu, 01 Jan 2099 00:00:00 GMT"}, {`private="a,b", max-age=1`, "0"}, {"max-age=99999999999", ""}} {
		f.Add(s[0], s[1], "12")
	}
	f.Fuzz(func(t *testing.T, cc, expires, age string) {
		h := http.Header{"Cache-Control": {cc}, "Expires": {expires}, "Age": {age}}
		if d := keysFreshFor(h, t0, 30*time.Second); d < 30*time.Second || d > maxKeyFreshness {
			t.Fatalf("%v outside [30s, 24h]", d)
		}
	})
}
