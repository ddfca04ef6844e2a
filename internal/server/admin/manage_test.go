package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/managed"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

const testToken = "s3cret-token"

// managedFixture is the admin API over a real managed.Manager whose
// Apply records the state in force.
type managedFixture struct {
	*fixture
	m       *managed.Manager
	mu      sync.Mutex
	applied managed.State
}

func newManagedFixture(t *testing.T) *managedFixture {
	t.Helper()
	f := &managedFixture{fixture: newFixture(t)}
	m, _, err := managed.New(managed.Config{
		Dir: t.TempDir(), Local: localTD,
		Reserved: func(td spiffeid.TrustDomain) string {
			if td == peerTD {
				return "--federation-config"
			}
			return ""
		},
		Apply: func(s managed.State) error { f.mu.Lock(); f.applied = s; f.mu.Unlock(); return nil },
	})
	require.NoError(t, err)
	f.m = m
	f.cfg.Manager, f.cfg.Token, f.cfg.TokenFile = m, testToken, "/data/admin.token"
	f.cfg.Static = func() []spiffeid.TrustDomain {
		var out []spiffeid.TrustDomain
		for _, b := range m.State().Bundles {
			out = append(out, b.TrustDomain())
		}
		return out
	}
	return f
}

func webEntry(td string) string {
	return fmt.Sprintf(`{"federation":[{"trustDomain":%q,"bundleEndpointURL":"https://%s/","bundleEndpointProfile":{"type":"https_web"}}]}`, td, td)
}

func send(t *testing.T, h http.Handler, method, target, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, bytes.NewBufferString(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

var bearer = []string{"Authorization", "Bearer " + testToken}

func TestMutationsNeedTheToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header []string
		socket bool
		token  string
		want   int
		msg    string
	}{
		{"missing token", nil, false, testToken, http.StatusUnauthorized, "missing admin token: send Authorization: Bearer <token>, the token the server wrote to /data/admin.token"},
		{"wrong token", []string{"Authorization", "Bearer nope"}, false, testToken, http.StatusUnauthorized, "wrong admin token"},
		{"not bearer", []string{"Authorization", "Basic " + testToken}, false, testToken, http.StatusUnauthorized, "missing admin token"},
		{"no token configured", []string{"Authorization", "Bearer "}, false, "", http.StatusUnauthorized, "wrong admin token"},
		{"cross-site with the token", append([]string{"Origin", "https://evil.example"}, bearer...), false, testToken, http.StatusForbidden, "cross-site"},
		{"good token, scheme in any case", []string{"Authorization", "bearer " + testToken}, false, testToken, http.StatusCreated, "federated with web.example"},
		{"follower", bearer, false, testToken, http.StatusConflict, "not the leader"},
		{"admin socket", nil, true, testToken, http.StatusCreated, "federated with web.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newManagedFixture(t)
			f.cfg.Token = tt.token
			if tt.name == "follower" {
				f.cfg.IsLeader = func() bool { return false }
			}
			h := New(f.cfg)
			for _, r := range []struct{ method, target, body string }{
				{http.MethodPost, "/v1/federation/relationships", webEntry("web.example")},
				{http.MethodPatch, "/v1/federation/relationships/web.example?no_fetch", `{"endpoint_url":"https://web2.example/"}`},
				{http.MethodDelete, "/v1/federation/relationships/web.example", ""},
				{http.MethodPut, "/v1/bundles/static.example", ""},
				{http.MethodDelete, "/v1/bundles/static.example", ""},
			} {
				req := httptest.NewRequest(r.method, r.target, bytes.NewBufferString(r.body))
				if tt.socket {
					req = req.WithContext(OverSocket(req.Context()))
				}
				for i := 0; i+1 < len(tt.header); i += 2 {
					req.Header.Set(tt.header[i], tt.header[i+1])
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if r.method != http.MethodPost {
					if tt.want >= 400 {
						assert.Equal(t, tt.want, rec.Code, r.target)
					}
					continue
				}
				assert.Equal(t, tt.want, rec.Code)
				assert.Contains(t, rec.Body.String(), tt.msg)
				if tt.want == http.StatusUnauthorized {
					assert.NotContains(t, rec.Body.String(), testToken, "the token is never echoed")
				}
			}
			if tt.want >= 400 {
				assert.Empty(t, f.m.State().Endpoints, "nothing changed")
			}
		})
	}
}

func TestAddRemoveAndList(t *testing.T) {
	t.Parallel()
	f := newManagedFixture(t)
	h := New(f.cfg)
	tests := []struct {
		name, method, target, body string
		want                       int
		msg                        string
	}{
		{"add", http.MethodPost, "/v1/federation/relationships?no_fetch", webEntry("web.example"), http.StatusCreated, "federated with web.example by web.example|https://web.example/"},
		{"add again", http.MethodPost, "/v1/federation/relationships", webEntry("web.example"), http.StatusConflict, "replace it with --force"},
		{"replace", http.MethodPost, "/v1/federation/relationships?force", webEntry("web.example"), http.StatusCreated, "federated"},
		{"configured in a file", http.MethodPost, "/v1/federation/relationships", webEntry("peer.example"), http.StatusConflict, "peer.example is configured by --federation-config; change it there"},
		{"own trust domain", http.MethodPost, "/v1/federation/relationships", webEntry("example.org"), http.StatusBadRequest, "own trust domain"},
		{"bad entry", http.MethodPost, "/v1/federation/relationships", `{"federation":[{"trustDomain":"x"}]}`, http.StatusBadRequest, `missing required key "bundleEndpointURL"`},
		{"two entries", http.MethodPost, "/v1/federation/relationships", `{"federation":[]}`, http.StatusBadRequest, "holds 0 federation entries, want 1"},
		{"remove unknown", http.MethodDelete, "/v1/federation/relationships/nope.example", "", http.StatusNotFound, "nope.example has no endpoint"},
		{"remove bad name", http.MethodDelete, "/v1/federation/relationships/NOPE", "", http.StatusBadRequest, `trust domain "NOPE"`},
	}
	for _, tt := range tests {
		rec := send(t, h, tt.method, tt.target, tt.body, bearer...)
		assert.Equal(t, tt.want, rec.Code, tt.name)
		assert.Contains(t, body(t, rec), tt.msg, tt.name)
	}

	rec := send(t, h, http.MethodPut, "/v1/bundles/static.example", string(testca.PEM(testca.New(t, "static.example").Cert)), bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Contains(t, rec.Body.String(), "set static.example's static bundle (trusted as is): 1 X.509 and 0 JWT authorities")

	rec = send(t, h, http.MethodGet, "/v1/federation/relationships", "")
	require.Equal(t, http.StatusOK, rec.Code)
	var rels []api.Relationship
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rels))
	assert.Equal(t, []api.Relationship{
		{TrustDomain: "peer.example", Origin: "file", EndpointURL: "https://peer.example/bundle", Profile: "https_web", State: "ok"},
		{TrustDomain: "static.example", Origin: api.OriginStatic},
	}, rels)

	rec = send(t, h, http.MethodDelete, "/v1/federation/relationships/web.example", "", bearer...)
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Empty(t, f.m.State().Endpoints)
}

func TestSetBundleRefusals(t *testing.T) {
	t.Parallel()
	f := newManagedFixture(t)
	h := New(f.cfg)
	static := testca.New(t, "static.example")
	leaf, _ := static.Issue(t, spiffeid.RequireFromString("spiffe://static.example/w"))
	tests := []struct {
		name, td, body string
		want           int
		msg            string
	}{
		{"names another trust domain", "static.example", string(testca.PEM(testca.New(t, "other.example").Cert)), http.StatusBadRequest, "bundle is for another trust domain"},
		{"a leaf", "static.example", string(testca.PEM(leaf)), http.StatusBadRequest, "not a CA"},
		{"garbage", "static.example", "{", http.StatusBadRequest, "bundle for static.example"},
		{"our own", "example.org", string(testca.PEM(testca.New(t, "example.org").Cert)), http.StatusBadRequest, "own trust domain"},
		{"configured in a file", "peer.example", string(testca.PEM(testca.New(t, "peer.example").Cert)), http.StatusConflict, "--federation-config"},
		{"too large", "static.example", strings.Repeat(" ", int(bundledoc.DefaultMaxSize)+1), http.StatusRequestEntityTooLarge, "request body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := send(t, h, http.MethodPut, "/v1/bundles/"+tt.td, tt.body, bearer...)
			assert.Equal(t, tt.want, rec.Code)
			assert.Contains(t, body(t, rec), tt.msg)
			assert.Empty(t, f.m.State().Bundles)
		})
	}
}

// A body whose read fails (a reset, a timeout) is a bad request, not one
// too large.
func TestBodyReadFailure(t *testing.T) {
	t.Parallel()
	f := newManagedFixture(t)
	req := httptest.NewRequest(http.MethodPost, "/v1/federation/relationships", iotest.ErrReader(errors.New("connection reset")))
	req.Header.Set("Authorization", "Bearer "+testToken)
	rec := httptest.NewRecorder()
	New(f.cfg).ServeHTTP(rec, req)
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	assert.Contains(t, rec.Body.String(), "connection reset")
}

// Concurrent requests are serialized by the manager: none is lost.
func TestConcurrentMutations(t *testing.T) {
	t.Parallel()
	f := newManagedFixture(t)
	h := New(f.cfg)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := send(t, h, http.MethodPost, "/v1/federation/relationships", webEntry(fmt.Sprintf("p%d.example", i)), bearer...)
			assert.Equal(t, http.StatusCreated, rec.Code)
		}()
	}
	wg.Wait()
	assert.Len(t, f.m.State().Endpoints, 16)
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Len(t, f.applied.Endpoints, 16)
}

// Without a Manager the routes that change state do not exist.
func TestNoManagerNoMutations(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec := send(t, New(f.cfg), http.MethodPost, "/v1/federation/relationships", webEntry("web.example"))
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}
