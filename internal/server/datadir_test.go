package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestServerCreatesPrivateDataDir(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "new", "data")
	startServer(t, dataDir, func(o *Config) { o.Init = true })
	for _, dir := range []string{dataDir, filepath.Join(dataDir, "ca")} {
		info, err := os.Stat(dir)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), info.Mode().Perm(), dir)
	}
}
