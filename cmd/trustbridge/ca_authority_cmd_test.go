package main

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

func authorityList(t *testing.T, s *e2eServer) api.CAAuthorities {
	t.Helper()
	var list api.CAAuthorities
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "ca", "authority", "list", "-o", "json", "--admin", s.admin)), &list))
	return list
}

// The incident-response sequence against a running server (issue 38):
// prepare, activate --now, taint the old root, revoke it; each step
// audited with who asked, and the list shows where each root stands.
func TestCAAuthorityIncidentResponse(t *testing.T) {
	dir := t.TempDir()
	s := startE2EServer(t, "example.org", dir, nil)
	auth := []string{"--admin", s.admin, "--data-dir", dir}
	list := authorityList(t, s)
	require.Len(t, list.X509, 1)
	old := list.X509[0]
	assert.Equal(t, "active", old.State)
	// A peer fetches our bundle before the successor exists.
	peer := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // only counted as a fetch; loopback, test only
	}}}
	resp, err := peer.Get(s.bundleURL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, api.CAKindRoot, old.Kind)

	out := mustCLI(t, append([]string{"ca", "authority", "prepare", "--x509"}, auth...)...)
	assert.Contains(t, out, "prepared root ")
	list = authorityList(t, s)
	require.Len(t, list.X509, 2)
	next := list.X509[1]
	assert.Equal(t, "prepared", next.State)

	// The server publishes what was prepared at once; activate --now
	// waits for nothing more.
	var stdout, stderr string
	var code int
	require.Eventually(t, func() bool {
		stdout, stderr, code = runCLIAt(t, time.Now, "", append([]string{"ca", "authority", "activate", "--x509", "--now"}, auth...)...)
		return code == 0 || !strings.Contains(stderr, "has not been published")
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "activated root "+next.ID)
	assert.Regexp(t, `warning: 127\.0\.0\.1 last fetched our bundle at \S+ \(sequence \d+\), before root `+next.ID, stdout,
		"activate --now names the peer that has not seen the new root")

	_, stderr, code = runCLIAt(t, time.Now, "", append([]string{"ca", "authority", "revoke", "--x509", old.ID}, auth...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "409 Conflict")
	assert.Contains(t, stderr, "not tainted: taint it first")

	assert.Contains(t, mustCLI(t, append([]string{"ca", "authority", "taint", "--x509", old.ID}, auth...)...), "tainted root "+old.ID)
	table := mustCLI(t, "ca", "authority", "list", "--x509", "--admin", s.admin)
	assert.Contains(t, table, "SIGNED LIVE/IN USE")
	assert.Contains(t, table, "signed: counted since")
	assert.Regexp(t, old.ID+`\s+root\s+RETIRED\s+\d{4}-`, table, "the taint is shown")

	assert.Contains(t, mustCLI(t, append([]string{"ca", "authority", "revoke", "--x509", old.ID}, auth...)...), "revoked root "+old.ID)
	list = authorityList(t, s)
	require.Len(t, list.X509, 2)
	assert.Equal(t, "revoked", list.X509[1].State, "listed until it expires")
	assert.NotNil(t, list.X509[1].RevokedAt)

	var requests []string
	require.Eventually(t, func() bool {
		requests = nil
		observed := 0
		for _, e := range servertest.ReadAuditLog(t, dir) {
			switch e.Event {
			case "ca_authority_prepared", "ca_authority_activated", "ca_authority_tainted", "ca_authority_revoked":
				requests = append(requests, e.Event+" "+e.Reason)
			case "root_tainted", "root_revoked":
				observed++
			}
		}
		return observed == 2
	}, 10*time.Second, 50*time.Millisecond, "the observer records the taint and the revocation")
	require.Len(t, requests, 4)
	assert.Contains(t, requests[1], "ca_authority_activated root "+next.ID+" by admin-token (admin API)")
	assert.Contains(t, requests[1], "activated early with --now")
	stdout, stderr, code = runCLIAt(t, time.Now, "", "audit", "log", "verify", dir+"/audit.jsonl")
	assert.Equal(t, 0, code, stdout+stderr)
}

func TestCAAuthorityFlags(t *testing.T) {
	for _, args := range [][]string{
		{"ca", "authority", "taint", "00"},
		{"ca", "authority", "taint", "--x509", "--jwt", "00"},
	} {
		_, stderr, code := runCLIAt(t, time.Now, "", append(args, "--admin", "http://127.0.0.1:1")...)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "give exactly one of --x509 and --jwt")
	}
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "authority", "revoke", "--x509")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "accepts 1 arg")
}
