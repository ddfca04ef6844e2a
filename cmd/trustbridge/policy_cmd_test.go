package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// policy explain asks the running server what a workload receives and
// why, as a table and as JSON.
func TestPolicyExplainCommand(t *testing.T) {
	o := policyServer(t, func(o *server.Config) { o.Policy.File = servertest.WritePolicy(t, t.TempDir(), servertest.GoodPolicy) })
	admin, _, _ := launchServer(t, o)
	id := "spiffe://example.org/ns/payments/sa/api"

	out, stderr, code := runCLI(t, "", "policy", "explain", id, "--admin", "http://"+admin)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, id+", default deny")
	assert.Contains(t, out, "selected by rule payments-to-partner (file:"+o.Policy.File+":3)")
	assert.Contains(t, out, "TRUST DOMAIN")
	assert.Contains(t, out, "example.org")

	out, stderr, code = runCLI(t, "", "policy", "explain", id, "--admin", "http://"+admin, "-o", "json")
	require.Equal(t, 0, code, stderr)
	var ex api.Explanation
	require.NoError(t, json.Unmarshal([]byte(out), &ex))
	assert.Equal(t, id, ex.SPIFFEID)
	assert.Equal(t, "deny", ex.Default)
	require.Len(t, ex.Matched, 1)
	assert.Equal(t, "payments-to-partner", ex.Matched[0].Rule)
	require.NotEmpty(t, ex.TrustDomains)
	assert.Equal(t, "example.org", ex.TrustDomains[0].TrustDomain)
	assert.True(t, ex.TrustDomains[0].Trusted, "the local trust domain")

	_, stderr, code = runCLI(t, "", "policy", "explain", "spiffe://other.example/x", "--admin", "http://"+admin)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "is not a workload of example.org")
}

// Offline, from a file: the partner is granted with its peer limit to
// payments, refused to others.
func TestPolicyExplainOffline(t *testing.T) {
	path := servertest.WritePolicy(t, t.TempDir(), servertest.GoodPolicy)
	for _, tc := range []struct {
		id      string
		trusted bool
	}{
		{"spiffe://example.org/ns/payments/sa/api", true},
		{"spiffe://example.org/ns/paymentsx/sa/api", false},
	} {
		t.Run(tc.id, func(t *testing.T) {
			out, stderr, code := runCLI(t, "", "policy", "explain", tc.id, "--trust-policy", path, "--trust-domain", "example.org", "-o", "json")
			require.Equal(t, 0, code, stderr)
			var ex api.Explanation
			require.NoError(t, json.Unmarshal([]byte(out), &ex))
			var partner *api.ExplainedTrustDomain
			for i := range ex.TrustDomains {
				if ex.TrustDomains[i].TrustDomain == "partner.example" {
					partner = &ex.TrustDomains[i]
				}
			}
			require.NotNil(t, partner, out)
			assert.Equal(t, tc.trusted, partner.Trusted)
			if tc.trusted {
				assert.Equal(t, []string{"spiffe://partner.example/ns/billing/sa/api"}, partner.Peers)
			}
			assert.NotEmpty(t, partner.Because)
		})
	}
	_, stderr, code := runCLI(t, "", "policy", "explain", "spiffe://example.org/a", "--trust-policy", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--trust-domain")
}

func TestPolicyCheckCommand(t *testing.T) {
	dir := t.TempDir()
	good := servertest.WritePolicy(t, dir, servertest.GoodPolicy)
	out, stderr, code := runCLI(t, "", "policy", "check", good, "--trust-domain", "example.org")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "1 rules, default deny")

	bad := filepath.Join(t.TempDir(), "policy.yaml")
	servertest.WritePolicy(t, filepath.Dir(bad), servertest.BadPolicy)
	_, stderr, code = runCLI(t, "", "policy", "check", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "policy.yaml:7")
	assert.Contains(t, stderr, `rule 2 "broken"`)
}

// policy explain sends the admin token when it can read it, so the
// server reads service account labels; without one it still explains,
// and says the labels were not looked up.
func TestPolicyExplainSendsToken(t *testing.T) {
	var mu sync.Mutex
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		ex := api.Explanation{SPIFFEID: r.URL.Query().Get("spiffe_id"), Default: "deny", Matched: []api.ExplainedMatch{}, TrustDomains: []api.ExplainedTrustDomain{}}
		if r.Header.Get("Authorization") == "" {
			ex.LabelsNote = api.LabelsNotLookedUp
		}
		_ = json.NewEncoder(w).Encode(ex)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600))
	id := "spiffe://example.org/ns/payments/sa/api"
	args := []string{"policy", "explain", id, "--admin", srv.URL, "--namespace", "payments", "--service-account", "api"}

	out, stderr, code := runCLI(t, "", append(args, "--admin-token-file", tokenFile)...)
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, "not looked up")

	out, stderr, code = runCLI(t, "", append(args, "--data-dir", dir)...)
	require.Equal(t, 0, code, stderr, "no token in the data directory: asked without")
	assert.Contains(t, out, "service account labels not looked up: ask with the admin token")

	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"Bearer s3cret", ""}, auth)
}
