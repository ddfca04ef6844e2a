package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/caclient"
)

const laptopToken = "laptop-bootstrap-token-0123456789"

var laptopID = spiffeid.RequireFromString("spiffe://example.org/vm/laptop")

// grpcAddr is the certificate service's address, as the start-up record
// in a server's log names it.
func grpcAddr(tb testing.TB, logs string) string {
	tb.Helper()
	return logAttr(tb, logs, "certificate service listening", "address")
}

func writeFile(t *testing.T, data string, perm os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(p, []byte(data), perm))
	return p
}

// The certificate service serves the ID the shared client expects.
func TestGRPCServingPathIsCAClientServerPath(t *testing.T) {
	assert.Equal(t, caclient.ServerPath, GRPCServingPath)
}
