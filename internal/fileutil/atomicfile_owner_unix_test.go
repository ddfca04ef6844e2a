//go:build unix

package fileutil

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplaceKeepsOwner: root replacing a service's file leaves it the
// service's, so the service can still read it at 0600.
func TestReplaceKeepsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another user needs root")
	}
	const nobody = 65534
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte("old"), 0o644))
	require.NoError(t, os.Chown(p, nobody, nobody))
	require.NoError(t, Replace(p, []byte("new"), 0o600))
	info, err := os.Stat(p)
	require.NoError(t, err)
	st := info.Sys().(*syscall.Stat_t)
	assert.Equal(t, uint32(nobody), st.Uid)
	assert.Equal(t, uint32(nobody), st.Gid)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "new", string(got))
}

// TestReplaceKeepsServiceGroup: a file of the writer's own that a service
// reads through its group (0640 root:trustbridge) keeps that group and
// its group bits; were it made 0600, the service could read it no more.
func TestReplaceKeepsServiceGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another group needs root")
	}
	const service = 65534
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte("old"), 0o600))
	require.NoError(t, os.Chown(p, 0, service))
	require.NoError(t, os.Chmod(p, 0o640))
	require.NoError(t, Replace(p, []byte("new"), 0o600))
	info, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, uint32(service), info.Sys().(*syscall.Stat_t).Gid)
	assert.Equal(t, os.FileMode(0o640), info.Mode().Perm())
}
