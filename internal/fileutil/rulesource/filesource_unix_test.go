//go:build unix

package rulesource

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A FIFO at the rules path is refused at once: opening it must not wait
// for a writer, which would hang the poller and SIGHUP's Check behind it.
func TestFileSourceRefusesFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	err := newTestSource(t, path, newFakeCombiner(), nil).Load()
	assert.ErrorContains(t, err, "not a regular file")
}
