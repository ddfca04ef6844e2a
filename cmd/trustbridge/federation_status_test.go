package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// federation status -o json|yaml prints the server's documents, keys as
// the server sent them (a newer server's too); table reads them.
func TestFederationStatusOutput(t *testing.T) {
	const body = `[{"trust_domain":"west.example","state":"ok","sequence":7,"consecutive_failures":0,"from_a_newer_server":true}]`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/v1/federation", r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	const asJSON = "[\n  {\n    \"trust_domain\": \"west.example\",\n    \"state\": \"ok\",\n    \"sequence\": 7,\n    \"consecutive_failures\": 0,\n    \"from_a_newer_server\": true\n  }\n]\n"
	for _, tc := range []struct {
		args    []string
		want    string
		contain string
		warns   bool
		wantErr string
	}{
		{args: nil, contain: "west.example   OK      7"},
		{args: []string{"-o", "table"}, contain: "TRUST DOMAIN"},
		{args: []string{"-o", "json"}, want: asJSON},
		{args: []string{"--json"}, want: asJSON, warns: true},
		{args: []string{"-o", "yaml"}, want: "- consecutive_failures: 0\n  from_a_newer_server: true\n  sequence: 7\n  state: ok\n  trust_domain: west.example\n"},
		{args: []string{"-o", "pem"}, wantErr: `-o "pem": want table, wide, name, json, yaml or jsonpath=TEMPLATE`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "", append([]string{"federation", "status", "--admin", srv.URL}, tc.args...)...)
			if tc.wantErr != "" {
				assert.Equal(t, 1, code)
				assert.Contains(t, stderr, tc.wantErr)
				return
			}
			require.Equal(t, 0, code, stderr)
			if tc.want != "" {
				assert.Equal(t, tc.want, stdout)
			}
			assert.Contains(t, stdout, tc.contain)
			assert.Equal(t, tc.warns, strings.Contains(stderr, "deprecated"), stderr)
		})
	}
}

// The formats kubectl users reach for, over a real command's output: -o
// wide adds columns, -o name prints one trust domain a line, --no-headers
// drops the header, jsonpath reads the JSON document -o json prints; a
// failing peer makes the exit status 3 in every format, unless
// --fail-on-error=false.
func TestFederationStatusFormats(t *testing.T) {
	const body = `[
 {"trust_domain":"west.example","endpoint_url":"https://west.example:8443/","profile":"https_spiffe",
  "endpoint_spiffe_id":"spiffe://west.example/trustbridge/bundle-endpoint","state":"ok","sequence":1234567890,
  "last_attempt":"2026-01-01T11:59:00Z","last_success":"2025-12-29T11:46:56Z","next_refresh":"2026-01-01T12:26:00Z",
  "consecutive_failures":0,"authorities":[],"origin":"flag","held":"fetched"},
 {"trust_domain":"north.example","endpoint_url":"https://127.0.0.1:1/","profile":"https_web","state":"failing","sequence":null,"origin":"runtime",
  "last_attempt":"2026-01-01T11:58:00Z","last_success":null,"last_error":"dial tcp 127.0.0.1:1: connect: connection refused",
  "next_refresh":"2026-01-01T11:59:30Z","consecutive_failures":8,"authorities":[]}]`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	status := func(args ...string) (string, string, int) {
		t.Helper()
		return runCLIAt(t, func() time.Time { return time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) }, "",
			append([]string{"federation", "status", "--admin", srv.URL}, args...)...)
	}
	const failing = "1 of 2 federated trust domains failing or stale: north.example (failing)"

	stdout, stderr, code := status()
	assert.Equal(t, cli.ExitPeersFailing, code)
	assert.Contains(t, stderr, failing)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 3, stdout)
	assert.Regexp(t, `^TRUST DOMAIN +STATE +SEQ +LAST SUCCESS +NEXT +FAILURES +ROOTS +EARLIEST EXPIRY +SOURCE +LAST ERROR$`, lines[0])
	assert.Regexp(t, `^west\.example +OK +1234567890 +3d ago +in 26m +0 +0 +- +fetched \(--federate\) *$`, lines[1])
	assert.Regexp(t, `^north\.example +FAILING +- +never +due +8 +0 +- +nothing fetched yet \(federation add\) +dial tcp 127\.0\.0\.1:1: connect: connection refused$`, lines[2])
	assert.NotContains(t, stdout, "72h13m4s", "ages as kubectl prints them")
	assert.NotContains(t, stdout, "https_spiffe", "profile is a wide column")

	stdout, _, _ = status("-o", "wide")
	assert.Regexp(t, `(?m)^TRUST DOMAIN +STATE +SEQ +LAST SUCCESS +LAST ATTEMPT +NEXT +FAILURES +ROOTS +EARLIEST EXPIRY +SOURCE +PROFILE +ENDPOINT URL +ENDPOINT SPIFFE ID +LAST ERROR$`, stdout)
	assert.Regexp(t, `(?m)^west\.example +OK +1234567890 +3d ago +60s ago +in 26m .* https_spiffe +https://west\.example:8443/ +spiffe://west\.example/trustbridge/bundle-endpoint`, stdout)

	stdout, stderr, code = status("-o", "name")
	assert.Equal(t, "west.example\nnorth.example\n", stdout)
	assert.Equal(t, cli.ExitPeersFailing, code)
	assert.Contains(t, stderr, failing)

	stdout, _, _ = status("--no-headers")
	assert.NotContains(t, stdout, "TRUST DOMAIN")
	assert.Len(t, strings.Split(strings.TrimSuffix(stdout, "\n"), "\n"), 2)
	assert.True(t, strings.HasPrefix(stdout, "west.example "), stdout)

	stdout, stderr, code = status("-o", `jsonpath={range .[*]}{.trust_domain}{" "}{.sequence}{"\n"}{end}`, "--fail-on-error=false")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "west.example 1234567890\nnorth.example null\n", stdout, "whole numbers print as digits, JSON null as null")
	stdout, _, _ = status("-o", `jsonpath={.[?(@.state=="failing")].last_error}`, "--fail-on-error=false")
	assert.Equal(t, "dial tcp 127.0.0.1:1: connect: connection refused", stdout)
}

// A template that does not parse is refused before the server is asked,
// saying what a template looks like.
func TestFederationStatusBadJSONPath(t *testing.T) {
	asked := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked = true }))
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ format, want string }{
		{"jsonpath={.[*].trust_domain", "-o jsonpath={.[*].trust_domain: unclosed action; templates look like '{.trust_domain}'"},
		{`jsonpath={.[?(@.state==}`, "-o jsonpath={.[?(@.state==}: unterminated filter"},
		{"jsonpath=", "-o jsonpath=: the template is empty"},
		{"jsonpath", `-o jsonpath: give the template after "="`},
	} {
		t.Run(tc.format, func(t *testing.T) {
			_, stderr, code := runCLI(t, "", "federation", "status", "--admin", srv.URL, "-o", tc.format)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tc.want)
		})
	}
	assert.False(t, asked, "refused before the server was asked")
}

// A peer at a refused loopback port makes federation status exit 3 once
// its poll has failed, naming it; --fail-on-error=false exits 0. No peer
// at all exits 0.
func TestFederationStatusExitCodeFailingPeer(t *testing.T) {
	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, nil)
	status := func(args ...string) (string, string, int) {
		return runCLIAt(t, time.Now, "", append([]string{"federation", "status", "--admin", local.admin}, args...)...)
	}
	_, stderr, code := status()
	require.Equal(t, 0, code, "no peers: %s", stderr)

	refused := "https://" + servertest.ReservePort(t) + "/"
	mustCLI(t, "federation", "add", "north.example", refused, "--no-fetch", "--admin", local.admin, "--data-dir", dir)
	// Pending within its first polls (exit 0), failing after three
	// refused ones (federation.stateOf); each refresh polls once more.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, _, _ = runCLIAt(t, time.Now, "", "federation", "refresh", "north.example", "--admin", local.admin, "--data-dir", dir)
		stdout, stderr, _ := status("-o", "json", "--fail-on-error=false")
		var doc []api.FederationStatus
		if assert.NoError(c, json.Unmarshal([]byte(stdout), &doc), stderr) && assert.Len(c, doc, 1) {
			assert.Equal(c, "failing", doc[0].State, "the refused peer is failing after its first polls")
		}
	}, 30*time.Second, 100*time.Millisecond)

	stdout, stderr, code := status()
	assert.Equal(t, cli.ExitPeersFailing, code)
	assert.Regexp(t, `(?m)^north\.example +FAILING +- +never `, stdout, "the table is printed before the exit status")
	assert.Regexp(t, `1 of 1 federated trust domains failing or stale: north\.example \(failing\)`, stderr)
	assert.Contains(t, stderr, "--fail-on-error=false")

	stdout, stderr, code = status("-o", "name", "--fail-on-error=false")
	assert.Equal(t, 0, code, stderr)
	assert.Equal(t, "north.example\n", stdout)
}

// federation list's table is a cli.Table too: -o name lists the trust
// domains, --no-headers the rows, jsonpath the relationships document.
func TestFederationListFormats(t *testing.T) {
	const body = `[{"trust_domain":"west.example","origin":"flag","endpoint_url":"https://west.example/","profile":"https_web","state":"ok"},
 {"trust_domain":"corp.example","origin":"static"}]`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/v1/federation/relationships", r.URL.Path)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	list := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := runCLI(t, "", append([]string{"federation", "list", "--admin", srv.URL}, args...)...)
		require.Equal(t, 0, code, stderr)
		return stdout
	}
	assert.Regexp(t, `^TRUST DOMAIN +ORIGIN +PROFILE +STATE +ENDPOINT URL +ENDPOINT SPIFFE ID\nwest\.example +flag +https_web +OK +https://west\.example/ +-\ncorp\.example +static +- +- +- +-\n$`, list())
	assert.Equal(t, "west.example\ncorp.example\n", list("-o", "name"))
	assert.Regexp(t, `^west\.example +flag .*\ncorp\.example +static .*\n$`, list("--no-headers"))
	assert.Equal(t, "flag static", list("-o", "jsonpath={[*].origin}"))
}
