package main

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// A peer that has never answered is pending for its first polls only,
// then failing everywhere: federation status, /ui's failing count, a
// critical audit finding (so a CI gate on audit fails) and the state
// metric the alert rules watch (issue 36, item 2).
func TestPeerNeverAnsweredIsFailing(t *testing.T) {
	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, nil)
	down := "https://" + servertest.ReservePort(t) + "/"
	mustCLI(t, "federation", "add", "north.example", down, "--no-fetch", "--admin", local.admin, "--data-dir", dir)

	var st api.FederationStatus
	require.Eventually(t, func() bool {
		st, _ = federationStatus(t, local, "north.example")
		return st.ConsecutiveFailures >= 3
	}, 30*time.Second, 20*time.Millisecond, "north.example never failed 3 polls: %+v", st)
	assert.Equal(t, "failing", st.State, "never answered in %d polls", st.ConsecutiveFailures)
	assert.Nil(t, st.LastSuccess)
	out, stderr, code := runCLIAt(t, time.Now, "", "federation", "status", "--admin", local.admin)
	assert.Regexp(t, `north\.example\s+FAILING`, out)
	assert.Equal(t, 3, code, "federation status exits 3 for a failing peer")
	assert.Contains(t, stderr, "north.example (failing)")

	out, stderr, code = runCLIAt(t, time.Now, "", "audit", "--admin", local.admin)
	assert.Equal(t, cli.ExitFindings, code, "a CI gate on audit sees the dead peer: %s %s", out, stderr)
	assert.Contains(t, out, "1 critical")
	assert.Contains(t, out, "north.example")
	out, _, _ = runCLIAt(t, time.Now, "", "audit", "--admin", local.admin, "-o", "json")
	var fs []api.Finding
	require.NoError(t, json.Unmarshal([]byte(out), &fs))
	require.NotEmpty(t, fs)
	assert.Equal(t, api.Finding{Severity: api.SeverityCritical, Code: audit.CodeNeverFetched, TrustDomain: "north.example"},
		api.Finding{Severity: fs[0].Severity, Code: fs[0].Code, TrustDomain: fs[0].TrustDomain})

	code, page := servertest.Get(t, local.admin+"/ui")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, `<span class="dot failing"></span>1 failing`)

	code, metrics := servertest.Get(t, local.admin+"/metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, metrics, `trustbridge_federation_state{state="failing",trust_domain="north.example"} 1`)
	assert.NotContains(t, metrics, `trustbridge_federation_bundle_age_seconds{trust_domain="north.example"}`,
		"TrustbridgeFederationNeverFetched keys on a failing peer without a bundle age")
}
