//go:build unix

package ca

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// A ca/ directory another user could write to is refused for reading and
// writing, and its content is left as it was; after chmod go-w it loads.
func TestStoreRefusesAWritableStateDir(t *testing.T) {
	s, _, id := storeWithRoot(t)
	require.NoError(t, os.Chmod(s.Dir(), 0o777))

	_, _, err := s.Load("example.org")
	require.ErrorIs(t, err, fileutil.ErrInsecureDir)
	assert.ErrorContains(t, err, "chmod go-w "+s.Dir())
	cert, key, err := newRootCert(tdExample, KeyECP256, t0, 24*time.Hour, false)
	require.NoError(t, err)
	_, err = s.writeRoot(cert, key)
	assert.ErrorIs(t, err, fileutil.ErrInsecureDir)
	assert.ErrorIs(t, s.saveJournal(&castate.Journal{TrustDomain: "example.org"}), fileutil.ErrInsecureDir)
	unlock, err := s.Lock(true)
	if err == nil {
		unlock()
	}
	assert.ErrorIs(t, err, fileutil.ErrInsecureDir)

	require.NoError(t, os.Chmod(s.Dir(), 0o700))
	j, roots, err := s.Load("example.org")
	require.NoError(t, err)
	require.Len(t, roots, 1)
	assert.Equal(t, id, roots[0].ID, "the last good state, untouched")
	assert.Equal(t, uint64(1), j.Sequence)
}

// roots/ holds the keys: writable by others, it is refused even under a
// tight ca/, for reading and writing, and the state is kept.
func TestStoreRefusesAWritableRootsDir(t *testing.T) {
	s, _, id := storeWithRoot(t)
	roots := s.Dir() + "/roots"
	require.NoError(t, os.Chmod(roots, 0o777))

	_, _, err := s.Load("example.org")
	require.ErrorIs(t, err, fileutil.ErrInsecureDir)
	assert.ErrorContains(t, err, "chmod go-w "+roots)
	cert, key, err := newRootCert(tdExample, KeyECP256, t0, 24*time.Hour, false)
	require.NoError(t, err)
	_, err = s.writeRoot(cert, key)
	assert.ErrorIs(t, err, fileutil.ErrInsecureDir)

	require.NoError(t, os.Chmod(roots, 0o700))
	_, loaded, err := s.Load("example.org")
	require.NoError(t, err)
	require.Len(t, loaded, 1)
	assert.Equal(t, id, loaded[0].ID, "the last good state, untouched")
}
