package fileutil

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key.pem")
	require.NoError(t, Write(p, []byte("one"), 0o600))
	require.NoError(t, Write(p, []byte("two"), 0o600))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "two", string(got))
	info, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temp files left behind")
}

func TestWriteFailureLeavesOldContent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	require.NoError(t, Write(p, []byte("old"), 0o644))
	// A directory in the way of the rename makes the write fail.
	require.Error(t, Write(filepath.Join(dir, "missing", "f"), []byte("x"), 0o644))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "old", string(got))
}

func TestReplaceCreatesLikeWrite(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, Replace(p, []byte("one"), 0o600))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "one", string(got))
}

// Replace narrows the mode of the file it replaces to perm, and never
// widens it: a 0400 file stays 0400.
func TestReplaceNeverWidensMode(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ old, perm, want os.FileMode }{
		{0o600, 0o600, 0o600},
		{0o400, 0o600, 0o400},
		{0o644, 0o600, 0o600},
		{0o604, 0o644, 0o604},
	} {
		p := filepath.Join(dir, tt.old.String())
		require.NoError(t, os.WriteFile(p, []byte("old"), 0o600))
		require.NoError(t, os.Chmod(p, tt.old))
		require.NoError(t, Replace(p, []byte("new"), tt.perm))
		info, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, tt.want, info.Mode().Perm(), "replacing a file of mode %v", tt.old)
	}
}

// WriteNew creates the file whole, with its mode, and never replaces one
// that exists; a failed fill leaves nothing, not even a temporary file.
func TestWriteNew(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "archive.tar.gz")
	fill := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	require.NoError(t, WriteNew(p, 0o600, fill("one")))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "one", string(got))
	info, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	assert.ErrorIs(t, WriteNew(p, 0o600, fill("two")), fs.ErrExist)
	got, err = os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "one", string(got), "never replaced")

	q := filepath.Join(dir, "failed")
	assert.ErrorIs(t, WriteNew(q, 0o600, func(io.Writer) error { return assert.AnError }), assert.AnError)
	assert.NoFileExists(t, q)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")
}
