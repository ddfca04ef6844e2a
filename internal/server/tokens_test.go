package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// TestBootstrapTokenLedgerCorrupt: a ledger that does not parse stops the
// server at start, naming the file and the way out, rather than forgetting
// which tokens were consumed.
func TestBootstrapTokenLedgerCorrupt(t *testing.T) {
	dataDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, authn.LedgerFileName), []byte(`{"version":1,"consumed":`), 0o600))
	o := baseServerOptions("example.org", dataDir)
	o.Init = true // the directory holds the ledger but no CA state yet
	o.GRPC = GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: servertest.WriteTokenFile(t, servertest.LaptopToken+","+servertest.LaptopID.String()+"\n"), TokenReview: TokenReviewOff}
	err := serverError(t, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--bootstrap-token-file: authn: consumed-token ledger "+filepath.Join(dataDir, authn.LedgerFileName))
	assert.Contains(t, err.Error(), "restore it from a backup")
}
