//go:build unix

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The server refuses a data directory, or its ca/ subdirectory, that
// another user could write to, says how to fix it, and writes nothing
// there; after the fix it starts. Directories it creates are 0700.
func TestServerRefusesAnInsecureDataDir(t *testing.T) {
	serve := func(dataDir string) (string, int) {
		_, stderr, code := runCLI(t, "", "server", "--trust-domain", "example.org", "--data-dir", dataDir, "--admin-listen", "127.0.0.1:0")
		return stderr, code
	}

	dataDir := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Mkdir(dataDir, 0o700))
	require.NoError(t, os.Chmod(dataDir, 0o777))
	stderr, code := serve(dataDir)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--data-dir: directory others can write to: "+dataDir+" is writable by its group and others")
	assert.Contains(t, stderr, "fix: chmod go-w "+dataDir)
	entries, err := os.ReadDir(dataDir)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written to it")

	require.NoError(t, os.Chmod(dataDir, 0o700))
	caDir := filepath.Join(dataDir, "ca")
	require.NoError(t, os.Mkdir(caDir, 0o700))
	require.NoError(t, os.Chmod(caDir, 0o770))
	stderr, code = serve(dataDir)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, caDir+" is writable by its group")
	assert.Contains(t, stderr, "fix: chmod go-w "+caDir)
	entries, err = os.ReadDir(caDir)
	require.NoError(t, err)
	assert.Empty(t, entries, "no root was created in it")

	if os.Geteuid() == 0 {
		require.NoError(t, os.Chmod(caDir, 0o700))
		require.NoError(t, os.Chown(dataDir, 65534, -1))
		stderr, code = serve(dataDir)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, dataDir+" is owned by uid 65534, not by uid 0")
		assert.Contains(t, stderr, "fix: chown 0 "+dataDir)
		require.NoError(t, os.Chown(dataDir, 0, -1))
	}

	// Fixed: it starts, and keeps ca/ private.
	require.NoError(t, os.Chmod(caDir, 0o700))
	startServer(t, dataDir)
	_, err = os.Stat(filepath.Join(caDir, "state.json"))
	assert.NoError(t, err)
}
