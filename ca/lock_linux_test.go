//go:build linux

package ca

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reader's shared lock needs no write access to the lock file, so that
// trustbridge backup reads a data directory it may not write to (a
// read-only mount, a snapshot); a writer's lock is opened for writing.
// The open mode is read from /proc: root, which tests often run as,
// would open a mode 0400 file for writing anyway.
func TestLockOpenMode(t *testing.T) {
	s, _, _ := storeWithRoot(t)
	for _, tt := range []struct {
		exclusive bool
		want      int
	}{{true, os.O_RDWR}, {false, os.O_RDONLY}} { // the writer creates the file
		unlock, err := s.Lock(tt.exclusive)
		require.NoError(t, err)
		assert.Equal(t, tt.want, lockFileAccessMode(t, s.lockPath()), "exclusive=%v", tt.exclusive)
		unlock()
	}
}

// lockFileAccessMode is the O_ACCMODE part of the flags this process
// holds path open with.
func lockFileAccessMode(t *testing.T, path string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != path {
			continue
		}
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		require.NoError(t, err)
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				require.NoError(t, err)
				return int(flags) & 3 // O_ACCMODE
			}
		}
	}
	t.Fatalf("%s is not open", path)
	return -1
}
