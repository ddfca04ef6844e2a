package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeTokenFile(t *testing.T, lines string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(p, []byte(lines), 0o600))
	return p
}
