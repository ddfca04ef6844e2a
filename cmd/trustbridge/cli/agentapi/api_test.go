package agentapi

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The socket is --socket-path, else SPIFFE_ENDPOINT_SOCKET, else the
// agent's default; a path becomes an absolute unix:// address.
func TestSocketAddress(t *testing.T) {
	abs, err := filepath.Abs("api.sock")
	require.NoError(t, err)
	for _, tc := range []struct {
		name, flag, env, want, wantErr string
	}{
		{name: "default", want: "unix://" + abs},
		{name: "environment", env: "unix:///run/agent.sock", want: "unix:///run/agent.sock"},
		{name: "flag over environment", flag: "/tmp/x.sock", env: "unix:///run/agent.sock", want: "unix:///tmp/x.sock"},
		{name: "tcp", flag: "tcp://127.0.0.1:8081", want: "tcp://127.0.0.1:8081"},
		{name: "bad environment", env: "ftp://x", wantErr: workloadapi.SocketEnv},
		{name: "bad flag", flag: "http://example.org", wantErr: "--socket-path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(workloadapi.SocketEnv, tc.env)
			c := conn{socket: tc.flag, defaultSocket: "api.sock", timeout: time.Second}
			got, err := c.addr()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// What an agent sends is printed escaped: a hint or a claim could carry a
// terminal escape sequence.
func TestTablesEscape(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, x509Table(&b, X509Output{SVIDs: []X509SVIDOutput{{SPIFFEID: "spiffe://example.org/a", Hint: "\x1b[2Jexternal",
		Chain: []CertOutput{{Subject: "CN=\x1b[31mred", Issuer: "O=x"}}}}}))
	assert.NotContains(t, b.String(), "\x1b")
	assert.Contains(t, b.String(), `\x1b[2Jexternal`)
	b.Reset()
	require.NoError(t, jwtTable(&b, JWTOutput{SVIDs: []JWTSVIDOutput{{SPIFFEID: "spiffe://example.org/a", Hint: "h\x07", Audience: []string{"a\x1b"}}}}))
	assert.NotContains(t, b.String(), "\x1b")
	assert.NotContains(t, b.String(), "\x07")
}
