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

func TestRead(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	require.NoError(t, os.WriteFile(small, []byte("0123456789"), 0o600))
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(small, link))
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))

	data, mode, err := Read(small, 10)
	require.NoError(t, err)
	assert.Equal(t, "0123456789", string(data))
	assert.Equal(t, os.FileMode(0o600), mode.Perm())

	data, _, err = Read(link, 10)
	require.NoError(t, err, "symlinks are followed")
	assert.Equal(t, "0123456789", string(data))

	_, _, err = Read(small, 9)
	assert.ErrorIs(t, err, ErrTooLarge)
	assert.EqualError(t, err, "larger than 9 bytes")

	_, _, err = Read(fifo, 10) // would block if opened without O_NONBLOCK
	assert.ErrorIs(t, err, ErrNotRegular)
	_, _, err = Read(dir, 10)
	assert.ErrorIs(t, err, ErrNotRegular)
	assert.EqualError(t, err, "not a regular file (d---------)")

	_, _, err = Read(filepath.Join(dir, "none"), 10)
	assert.ErrorIs(t, err, os.ErrNotExist)

	_, _, err = ReadFile(small, 9)
	assert.EqualError(t, err, small+" is larger than 9 bytes")
	assert.ErrorIs(t, err, ErrTooLarge)
	_, _, err = ReadFile(filepath.Join(dir, "none"), 10)
	assert.ErrorContains(t, err, "none: no such file", "file system errors name the path once")
	assert.NotContains(t, err.Error(), " is ")
}
