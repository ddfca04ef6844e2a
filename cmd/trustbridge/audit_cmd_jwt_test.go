package main

import (
	"crypto/rand"
	"crypto/rsa"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// trustbridge audit reports a peer's weak JWT authority with its kid and
// how to fix it, and fails the pipeline on it.
func TestAuditCommandJWTFindings(t *testing.T) {
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	snap := api.Snapshot{Time: time.Now(), TrustDomain: "east.example", Actor: "r1", TrustDomains: []api.TrustDomain{
		{Name: "east.example", Local: true, Authorities: []api.Authority{}},
		{Name: "west.example", Federation: &api.Federation{EndpointURL: "https://west.example/", State: "ok"},
			Authorities: []api.Authority{api.KeyAuthority(api.KindJWT, "west-2019", weak.Public())}},
	}}
	out, stderr, code := runCLI(t, "", "audit", "--admin", serveFakeSnapshot(t, snap))
	assert.Equal(t, cli.ExitFindings, code, stderr)
	assert.Contains(t, out, "1 critical, 0 warning")
	assert.Contains(t, out, audit.CodeJWTWeakKey)
	assert.Contains(t, out, `JWT authority "west-2019" of west.example has a 1024-bit RSA key`)
	assert.Contains(t, out, "fix: ask west.example's operators to replace it")
}
