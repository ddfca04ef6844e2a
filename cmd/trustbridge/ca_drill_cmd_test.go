package main

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// fetchBundlePeriodically is a federated peer as the bundle endpoint
// sees it: a GET of url every interval, at most max times, until the end
// of the test. The first fetch is done when it returns.
func fetchBundlePeriodically(t *testing.T, url string, interval time.Duration, maxFetches int) {
	t.Helper()
	peer := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // only counted as a fetch; loopback, test only
	}}}
	fetch := func(ctx context.Context) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return
		}
		req.Header.Set("User-Agent", "drill-peer")
		if resp, err := peer.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	fetch(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for range maxFetches {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				fetch(ctx)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		peer.CloseIdleConnections()
	})
}

// svidIssuer is the authority key identifier (hex) of the X509-SVID the
// Workload API at addr serves.
func svidIssuer(t *testing.T, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	svid, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr(addr))
	require.NoError(t, err)
	return hex.EncodeToString(svid.Certificates[0].AuthorityKeyId)
}

// ca drill against a running server with one agent holding an SVID and
// one peer fetching the bundle (issue 38, item 4): every step in order,
// the agent's SVID re-issued by the successor, the old root revoked and
// the peer's fetch of the revocation seen. Then the JWT key, as JSON.
func TestCADrill(t *testing.T) {
	dir := t.TempDir()
	tokens := servertest.WriteTokenFile(t, eastToken+","+eastWorkload.String()+",reusable\n")
	s := startE2EServer(t, "east.example", dir, func(o *server.Config) {
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff, ReissueSpread: time.Second}
	})
	addr := workloadAgent(t, s, eastToken)
	old := authorityList(t, s).X509[0]
	require.Equal(t, old.SubjectKeyID, svidIssuer(t, addr), "the agent's SVID comes from the active root")
	fetchBundlePeriodically(t, s.bundleURL, 100*time.Millisecond, 1200)

	began := time.Now()
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "drill", "--x509", "--yes", "--poll", "100ms", "--timeout", "60s",
		"--admin", s.admin, "--data-dir", dir)
	t.Logf("ca drill --x509 took %s:\n%s", time.Since(began).Round(time.Millisecond), stdout)
	require.Equal(t, 0, code, stdout+stderr)
	assert.Regexp(t, `(?m)^\S+\s+\+\S+\s+list\s+active root `+old.ID+`, \d+ in use; .*waits for 1 client .*: 127\.0\.0\.1 \("drill-peer"`, stdout)
	assert.Regexp(t, `(?m)^\S+\s+\+\S+\s+in use: \d+`, stdout, "the re-issue's progress")
	assert.Regexp(t, `(?m)^\S+\s+\+\S+\s+127\.0\.0\.1 fetched sequence \d+`, stdout)
	timeline := stdout[strings.Index(stdout, "STEP "):]
	var steps []string
	for _, m := range regexp.MustCompile(`(?m)^(\w+)\s+\d\d:\d\d:\d\d\.\d+Z\s+\S+\s+\S+$`).FindAllStringSubmatch(timeline, -1) {
		steps = append(steps, m[1])
	}
	assert.Equal(t, []string{"list", "prepare", "activate", "taint", "reissued", "revoke", "refetched"}, steps, timeline)

	states := map[string]string{}
	var successor api.CAAuthority
	for _, a := range authorityList(t, s).X509 {
		states[a.ID] = a.State
		if a.ID != old.ID {
			successor = a
		}
	}
	assert.Equal(t, map[string]string{old.ID: "revoked", successor.ID: "active"}, states, "the old root is listed as revoked until it expires")
	assert.Contains(t, timeline, "root "+old.ID+" replaced by "+successor.ID+", revoked at sequence ")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, successor.SubjectKeyID, svidIssuer(t, addr))
	}, 10*time.Second, 50*time.Millisecond, "the agent's SVID was re-issued by the successor")

	// The JWT key: no JWT-SVID was minted, so nothing waits for a
	// re-issue; the timeline is JSON on stdout, the progress on stderr.
	stdout, stderr, code = runCLIAt(t, time.Now, "", "ca", "drill", "--jwt", "--yes", "--poll", "100ms", "--timeout", "60s",
		"-o", "json", "--admin", s.admin, "--data-dir", dir)
	require.Equal(t, 0, code, stdout+stderr)
	assert.Contains(t, stderr, "refetched")
	var res struct {
		Kind, Tainted, Successor string
		RevokedSequence          uint64 `json:"revoked_sequence"`
		Peers                    []string
		Steps                    []struct{ Step string }
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	assert.Equal(t, "jwt", res.Kind)
	assert.Equal(t, []string{"127.0.0.1"}, res.Peers)
	require.Len(t, res.Steps, 7)
	assert.Equal(t, "refetched", res.Steps[6].Step)
	list := authorityList(t, s)
	assert.Equal(t, res.RevokedSequence, list.Sequence)
	states = map[string]string{}
	for _, k := range list.JWT {
		states[k.ID] = k.State
	}
	assert.Equal(t, "revoked", states[res.Tainted])
	assert.Equal(t, "active", states[res.Successor])
}

func TestCADrillRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--x509"}, "retires and revokes the trust domain's active authority for real"},
		{[]string{"--x509", "--jwt", "--yes"}, "give exactly one of --x509 and --jwt"},
		{[]string{"--yes"}, "give exactly one of --x509 and --jwt"},
		{[]string{"--jwt", "--yes", "--poll", "0s"}, "must be positive"},
	} {
		_, stderr, code := runCLIAt(t, time.Now, "", append([]string{"ca", "drill", "--admin", "http://127.0.0.1:1"}, tc.args...)...)
		assert.Equal(t, 1, code, tc.args)
		assert.Contains(t, stderr, tc.want, tc.args)
	}
}

// fakeDrillAdmin is an admin API whose root 0a signed one certificate
// that is never re-issued; counted says whether it counts at all. It
// has no bundle endpoint. It records the changes asked of it.
type fakeDrillAdmin struct {
	counted bool
	mu      sync.Mutex
	actions []string
	roots   []api.CAAuthority
}

func (f *fakeDrillAdmin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now().UTC()
	switch r.Method + " " + r.URL.Path {
	case "GET /v1/ca/authorities":
		list := api.CAAuthorities{TrustDomain: "lab.example", Sequence: 5, X509: f.roots, JWT: []api.CAAuthority{}}
		if f.counted {
			list.SignedSince = &now
		}
		_ = json.NewEncoder(w).Encode(list)
	case "GET /v1/trust":
		_ = json.NewEncoder(w).Encode(api.Trust{TrustDomain: "lab.example", RefreshHintSeconds: 300})
	case "POST /v1/ca/authorities":
		var c api.CAAuthorityChange
		_ = json.NewDecoder(r.Body).Decode(&c)
		f.actions = append(f.actions, c.Action)
		_ = json.NewEncoder(w).Encode(api.CAAuthorityResult{Authority: f.change(c, now), Message: c.Action + " done"})
	default:
		http.Error(w, "no bundle endpoint here", http.StatusNotFound)
	}
}

// change applies c to the roots as the CA would, and returns the root
// it changed.
func (f *fakeDrillAdmin) change(c api.CAAuthorityChange, now time.Time) api.CAAuthority {
	switch c.Action {
	case "prepare":
		f.roots = append(f.roots, api.CAAuthority{ID: "0b", Kind: api.CAKindRoot, State: "prepared", PublishedAt: &now, Signed: &api.SignedCount{}})
		return f.roots[1]
	case "activate":
		f.roots[0].State, f.roots[1].State = "retired", "active"
		return f.roots[1]
	}
	f.roots[0].TaintedAt = &now
	return f.roots[0]
}

// The drill stops, with what to do, where it cannot see the re-issue or
// the re-issue does not finish: nothing changed in the first case, the
// old root left tainted (never revoked) in the second.
func TestCADrillStops(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("secret\n"), 0o600))
	for _, tc := range []struct {
		name       string
		counted    bool
		incomplete string
		want       []string
		actions    []string
	}{
		{name: "not counted", want: []string{"does not count what its authorities sign", "nothing was changed"}},
		{name: "counts cannot vouch", counted: true, incomplete: "it signed from 2026-12-01T00:00:00Z, before this replica began counting",
			want: []string{"cannot vouch for everything root 0a signed (it signed from 2026-12-01T00:00:00Z", "nothing was changed", "--force"}},
		{name: "never re-issued", counted: true, actions: []string{"prepare", "activate", "taint"},
			want: []string{"root 0a: 1 workloads still present what it signed after --timeout 300ms", "it stays tainted, and critical in `trustbridge audit`, until revoked",
				"trustbridge ca authority revoke --x509 0a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeDrillAdmin{counted: tc.counted, roots: []api.CAAuthority{{ID: "0a", Kind: api.CAKindRoot, State: "active"}}}
			if tc.counted {
				f.roots[0].Signed = &api.SignedCount{Live: 1, InUse: 1, Incomplete: tc.incomplete}
			}
			srv := httptest.NewServer(f)
			defer srv.Close()
			stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "drill", "--x509", "--yes", "--poll", "50ms", "--timeout", "300ms",
				"--admin", srv.URL, "--admin-token-file", tokenFile)
			assert.Equal(t, 1, code)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			assert.Equal(t, tc.actions, f.actions)
			if tc.counted && tc.incomplete == "" {
				assert.Contains(t, stdout, "the server has no bundle endpoint: no peer to wait for")
				assert.Regexp(t, `(?m)^taint\s+\S+\s+\S+\s+\S+\n\n.*stopped: see the error`, stdout, "the timeline up to where it stopped")
			}
		})
	}
}
