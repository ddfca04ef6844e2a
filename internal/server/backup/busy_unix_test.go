//go:build unix

package backup

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInstallRefusesABusyTarget: a target a process holds a lock in (a
// running server) is refused even with force, and restored once released.
func TestInstallRefusesABusyTarget(t *testing.T) {
	parent := t.TempDir()
	target := filepath.Join(parent, "data")
	write(t, target, "ca/state.json", "current", 0o600)
	write(t, target, "trustbridge.lock", "", 0o600)
	staged := func() string {
		d, err := os.MkdirTemp(parent, ".restore-")
		require.NoError(t, err)
		write(t, d, "ca/state.json", "restored", 0o600)
		return d
	}
	state := func() string {
		data, err := os.ReadFile(filepath.Join(target, "ca", "state.json"))
		require.NoError(t, err)
		return string(data)
	}
	f, err := os.Open(filepath.Join(target, "trustbridge.lock"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX))

	_, err = Install(staged(), target, true, t0)
	require.ErrorIs(t, err, ErrBusy)
	assert.ErrorContains(t, err, "trustbridge.lock")
	assert.Equal(t, "current", state())

	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_UN))
	_, err = Install(staged(), target, true, t0)
	require.NoError(t, err, "released: the restore goes ahead")
	assert.Equal(t, "restored", state())
}
