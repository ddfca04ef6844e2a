//go:build unix

package trustpolicy

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A FIFO at the policy path is refused at once: opening it must not wait
// for a writer, which would hang the poller and SIGHUP's Check behind it.
func TestFileSourceRefusesFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	c, _, _, _ := newTestCombiner(t, DefaultAllow)
	err := NewFileSource(path, c, nil, 0).Load()
	assert.ErrorContains(t, err, "not a regular file")
}
