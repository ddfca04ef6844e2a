package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		{args: nil, contain: "west.example  OK     7"},
		{args: []string{"-o", "table"}, contain: "TRUST DOMAIN"},
		{args: []string{"-o", "json"}, want: asJSON},
		{args: []string{"--json"}, want: asJSON, warns: true},
		{args: []string{"-o", "yaml"}, want: "- consecutive_failures: 0\n  from_a_newer_server: true\n  sequence: 7\n  state: ok\n  trust_domain: west.example\n"},
		{args: []string{"-o", "pem"}, wantErr: `-o "pem": want table, json, yaml`},
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
