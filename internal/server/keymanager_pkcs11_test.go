//go:build cgo

package server

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/hsmtest"
)

// TestServerKeysInSoftHSM runs the server with its keys in a SoftHSM2
// token and --require-hsm: the state names the keys by reference and
// holds no private key, the snapshot says where they are, and a restart
// finds them again.
func TestServerKeysInSoftHSM(t *testing.T) {
	module, label, pin := hsmtest.Token(t)
	pinFile := filepath.Join(t.TempDir(), "pin")
	require.NoError(t, os.WriteFile(pinFile, []byte(pin+"\n"), 0o600))
	withHSM := func(o *Config) {
		o.Keys = KeyManagerConfig{kind: "pkcs11", module: module, tokenLabel: label, slot: -1, pinFile: pinFile, requireHSM: true}
	}
	dataDir := t.TempDir()
	addr, logs := startServer(t, dataDir, withHSM)
	assert.Equal(t, "self-signed, state in "+filepath.Join(dataDir, "ca")+", keys in PKCS#11 token \""+label+"\" (module "+module+")",
		servertest.LogAttr(t, logs.String(), "trustbridge server started", "ca"), "the start-up record says where the keys are")

	j, _, err := ca.NewStore(dataDir).Load("")
	require.NoError(t, err)
	require.Len(t, j.Roots, 1)
	require.NotEmpty(t, j.Roots[0].KeyRef)
	require.NotEmpty(t, j.JWTKeys)
	require.NotEmpty(t, j.JWTKeys[0].KeyRef)
	files, err := os.ReadDir(filepath.Join(dataDir, "ca", "roots"))
	require.NoError(t, err)
	for _, f := range files {
		assert.False(t, strings.HasSuffix(f.Name(), ".key.pem"), "no private key in the state: %s", f.Name())
	}

	code, body := servertest.Get(t, "http://"+addr+"/v1/snapshot")
	require.Equal(t, http.StatusOK, code)
	var snap api.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &snap))
	assert.True(t, snap.RequireHSM)
	own := 0
	for _, a := range snap.TrustDomains[0].Authorities {
		if a.State != "" {
			own++
			assert.Contains(t, a.KeyStorage, "pkcs11 token")
		}
	}
	assert.Equal(t, 2, own, "the root and the JWT key")

	// A second server on the same state and token (the first still holds
	// the data directory, so a copy of it) finds the same keys.
	copyDir := t.TempDir()
	require.NoError(t, os.CopyFS(copyDir, os.DirFS(dataDir)))
	require.NoError(t, os.Remove(filepath.Join(copyDir, "trustbridge.lock")))
	require.NoError(t, os.Chmod(copyDir, 0o700))
	startServer(t, copyDir, withHSM)
	j2, _, err := ca.NewStore(copyDir).Load("")
	require.NoError(t, err)
	assert.Equal(t, j.Roots[0].KeyRef, j2.Roots[0].KeyRef)
}
