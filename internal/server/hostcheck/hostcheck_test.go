package hostcheck

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAllowed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		listen  string
		allowed []string
		host    string
		want    bool
	}{
		// Loopback bind (the default 127.0.0.1:15014).
		{"127.0.0.1:15014", nil, "127.0.0.1:15014", true},
		{"127.0.0.1:15014", nil, "127.0.0.1", true},
		{"127.0.0.1:15014", nil, "127.0.0.1:8080", true}, // kubectl port-forward 8080:15014
		{"127.0.0.1:15014", nil, "localhost:15014", true},
		{"127.0.0.1:15014", nil, "LOCALHOST.:15014", true},
		{"127.0.0.1:15014", nil, "[::1]:15014", true},
		{"127.0.0.1:15014", nil, "127.0.0.2:15014", true},
		{"127.0.0.1:15014", nil, "", true},
		{"127.0.0.1:15014", nil, "evil.example:15014", false},
		{"127.0.0.1:15014", nil, "evil.example", false},
		{"127.0.0.1:15014", nil, "localhost.evil.example:15014", false},
		{"127.0.0.1:15014", nil, "10.0.0.1:15014", false},
		{"127.0.0.1:15014", nil, "2130706433:15014", false}, // not a literal netip accepts: a name
		{"[::1]:15014", nil, "[::1]:15014", true},
		{"[::1]:15014", nil, "[::1]", true},
		{"[::1]:15014", nil, "localhost", true},
		{"[::1]:15014", nil, "evil.example", false},

		// Every address (the Kubernetes deployment): any IP literal, as
		// probes send Host: <pod IP>:<port>; names only when listed.
		{"0.0.0.0:15014", nil, "10.244.1.7:15014", true},
		{"0.0.0.0:15014", nil, "[fd00::7]:15014", true},
		{"0.0.0.0:15014", nil, "localhost:15014", true},
		{"0.0.0.0:15014", nil, "trustbridge-admin.trustbridge-system.svc:15014", false},
		{"0.0.0.0:15014", []string{"trustbridge-admin.trustbridge-system.svc"}, "trustbridge-admin.trustbridge-system.svc:15014", true},
		{"0.0.0.0:15014", []string{"trustbridge-admin.trustbridge-system.svc"}, "Trustbridge-Admin.trustbridge-system.svc.:80", true},
		{"0.0.0.0:15014", []string{"admin.example:8080"}, "admin.example:8080", true},
		{"0.0.0.0:15014", []string{"admin.example:8080"}, "admin.example:15014", false},
		{"0.0.0.0:15014", []string{"admin.example:8080"}, "admin.example", false},
		{"[::]:15014", nil, "10.0.0.1", true},
		{"[::]:15014", nil, "evil.example", false},
		{":15014", nil, "192.0.2.1:15014", true},
		{":15014", nil, "evil.example:15014", false},

		// One non-loopback address.
		{"10.0.0.5:15014", nil, "10.0.0.5:15014", true},
		{"10.0.0.5:15014", nil, "10.0.0.6:15014", false},
		{"10.0.0.5:15014", nil, "127.0.0.1:15014", false},
		{"10.0.0.5:15014", nil, "localhost:15014", false},
		{"10.0.0.5:15014", []string{"192.0.2.9"}, "192.0.2.9:443", true},
		{"10.0.0.5:15014", []string{"admin.internal"}, "admin.internal:15014", true},

		// Bound by name.
		{"localhost:15014", nil, "localhost:15014", true},
		{"localhost:15014", nil, "127.0.0.1:15014", true},
		{"localhost:15014", nil, "evil.example:15014", false},
		{"admin.internal:15014", nil, "admin.internal:15014", true},
		{"admin.internal:15014", nil, "evil.example:15014", false},
	}
	for _, tt := range tests {
		t.Run(tt.listen+"/"+tt.host, func(t *testing.T) {
			c, err := New(Config{Listen: tt.listen, Allowed: tt.allowed})
			require.NoError(t, err)
			assert.Equal(t, tt.want, c.Allowed(tt.host))
		})
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Listen: "15014"}, `listen address "15014"`},
		{Config{Listen: ":1", Allowed: []string{"https://admin.example/"}}, `allowed host "https://admin.example/"`},
		{Config{Listen: ":1", Allowed: []string{""}}, `allowed host ""`},
		{Config{Listen: ":1", Allowed: []string{"a b"}}, `allowed host "a b"`},
		{Config{Listen: ":1", Allowed: []string{"user@admin.example"}}, `allowed host "user@admin.example"`},
	} {
		_, err := New(tc.cfg)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestWrap(t *testing.T) {
	t.Parallel()
	var refused []string
	c, err := New(Config{Listen: "127.0.0.1:15014", Flag: "--admin-allowed-hosts",
		OnRefuse: func(r *http.Request) { refused = append(refused, r.Host) }})
	require.NoError(t, err)
	h := c.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "snapshot") }))

	req := httptest.NewRequest(http.MethodGet, "http://evil.example:15014/v1/snapshot", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusMisdirectedRequest, rec.Code)
	assert.Contains(t, rec.Body.String(), `host "evil.example:15014" is not a name of this listener`)
	assert.Contains(t, rec.Body.String(), "--admin-allowed-hosts")
	assert.NotContains(t, rec.Body.String(), "snapshot")
	assert.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))

	req = httptest.NewRequest(http.MethodGet, "http://127.0.0.1:15014/v1/snapshot", nil)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "snapshot", rec.Body.String())
	assert.Equal(t, []string{"evil.example:15014"}, refused, "OnRefuse hears of refusals only")
}

// FuzzAllowed: the Host parser never panics, and on a loopback bind with
// no names allowed, what passes is empty, localhost, or a loopback
// address: never a name an attacker's DNS answers for.
func FuzzAllowed(f *testing.F) {
	for _, s := range []string{"127.0.0.1:15014", "localhost", "[::1]:1", "evil.example:15014", "[", "]:", "[::ffff:127.0.0.1]", "%", "localhost.:0", "", "[::1%lo]:1"} {
		f.Add(s)
	}
	c, err := New(Config{Listen: "127.0.0.1:15014"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host string) {
		if !c.Allowed(host) || host == "" {
			return
		}
		h, _, err := net.SplitHostPort(host)
		if err != nil {
			h = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		}
		if strings.EqualFold(strings.TrimSuffix(h, "."), "localhost") {
			return
		}
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Unmap().IsLoopback() {
			t.Fatalf("%q passed on a loopback bind", host)
		}
	})
}
