//go:build unix

package fileutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnsureCreatesPrivateDirs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "ca")
	require.NoError(t, EnsureDir(dir))
	for _, p := range []string{dir, filepath.Dir(dir)} {
		info, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), info.Mode().Perm(), p)
	}
	require.NoError(t, EnsureDir(dir), "an existing private directory passes")
}

// A directory others can write to is refused with the command that fixes
// it, and left as it was (nothing is chmodded behind the operator's back);
// after the fix it passes.
func TestCheckRefusesWritableByOthers(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		who  string
	}{
		{0o770, "writable by its group ("},
		{0o707, "writable by others ("},
		{0o777, "writable by its group and others ("},
		{0o777 | os.ModeSticky, "writable by its group and others ("},
		{0o775, "writable by its group ("},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			require.NoError(t, os.Mkdir(dir, 0o700))
			require.NoError(t, os.Chmod(dir, tc.mode))
			err := EnsureDir(dir)
			require.ErrorIs(t, err, ErrInsecureDir)
			assert.ErrorContains(t, err, dir+" is "+tc.who)
			assert.ErrorContains(t, err, "fix: chmod go-w "+dir)
			info, serr := os.Stat(dir)
			require.NoError(t, serr)
			assert.Equal(t, tc.mode.Perm(), info.Mode().Perm(), "left as it was")

			require.NoError(t, os.Chmod(dir, info.Mode().Perm()&^0o022))
			assert.NoError(t, CheckDir(dir))
		})
	}
	for _, mode := range []os.FileMode{0o700, 0o750, 0o755, 0o500} {
		dir := filepath.Join(t.TempDir(), "data")
		require.NoError(t, os.Mkdir(dir, mode))
		require.NoError(t, os.Chmod(dir, mode))
		assert.NoError(t, CheckDir(dir), mode)
	}
}

// A directory owned by another user is refused, with the chown that fixes
// it. As root the test hands the directory to nobody; otherwise it asks
// as if it ran as another uid.
func TestCheckRefusesAnotherOwner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Mkdir(dir, 0o700))
	euid := os.Geteuid()
	owner := euid
	if euid == 0 {
		owner = 65534
		require.NoError(t, os.Chown(dir, owner, -1))
	} else {
		euid++
	}
	err := check(dir, euid)
	require.ErrorIs(t, err, ErrInsecureDir)
	assert.ErrorContains(t, err, dir+" is owned by uid ")
	assert.ErrorContains(t, err, "fix: chown ")
	if os.Geteuid() == 0 {
		assert.ErrorIs(t, CheckDir(dir), ErrInsecureDir, "the real check, as root")
		require.NoError(t, os.Chown(dir, 0, -1))
		assert.NoError(t, CheckDir(dir), "fixed")
	}
}

// Root owning the directory is fine for any user: root could change it
// anyway. Running as root, t.TempDir is root's; otherwise "/" stands in.
func TestCheckAcceptsRootOwned(t *testing.T) {
	assert.NoError(t, check(t.TempDir(), os.Geteuid()))
	info, err := os.Stat("/")
	require.NoError(t, err)
	if info.Mode().Perm()&0o022 == 0 {
		assert.NoError(t, check("/", 12345))
	}
}

func TestCheckFollowsSymlinksAndNeedsADirectory(t *testing.T) {
	base := t.TempDir()
	good := filepath.Join(base, "good")
	bad := filepath.Join(base, "bad")
	require.NoError(t, os.Mkdir(good, 0o700))
	require.NoError(t, os.Mkdir(bad, 0o700))
	require.NoError(t, os.Chmod(bad, 0o777))
	require.NoError(t, os.Symlink(good, filepath.Join(base, "to-good")))
	require.NoError(t, os.Symlink(bad, filepath.Join(base, "to-bad")))
	assert.NoError(t, CheckDir(filepath.Join(base, "to-good")))
	assert.ErrorIs(t, CheckDir(filepath.Join(base, "to-bad")), ErrInsecureDir)

	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	assert.ErrorContains(t, EnsureDir(file), "not a directory")
	assert.ErrorIs(t, CheckDir(filepath.Join(base, "missing")), os.ErrNotExist)
}
