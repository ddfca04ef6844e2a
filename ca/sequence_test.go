package ca

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
)

func TestNextSequence(t *testing.T) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	sec := uint64(now.Unix())
	for _, tc := range []struct {
		name string
		prev uint64
		now  time.Time
		want uint64
	}{
		{"first change: the time", 0, now, sec},
		{"an old counter jumps to the time", 7, now, sec},
		{"a second change in the same second: one more", sec, now, sec + 1},
		{"changes ahead of the time keep counting", sec + 5, now, sec + 6},
		{"a clock that went back never takes the sequence back", sec, now.Add(-time.Hour), sec + 1},
		{"a clock before 1970 counts from prev", 3, time.Unix(-10, 0), 4},
		{"the largest sequence stays, never wraps to 0", math.MaxUint64, now, math.MaxUint64},
		{"later: the time again", sec + 1, now.Add(time.Minute), sec + 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, nextSequence(tc.prev, tc.now))
		})
	}
}

// copyTree copies a data directory the way an operator's backup would,
// modes included.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), info.Mode().Perm())
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), data, info.Mode().Perm())
	}))
}

// TestRestoredStateIsPublishedAboveEverythingBefore: a copy of the state
// taken before two rotations, put back and started again, publishes a
// sequence above every sequence published before, including those of the
// rotations the copy does not know about.
func TestRestoredStateIsPublishedAboveEverythingBefore(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	backup := filepath.Join(t.TempDir(), "backup")
	copyTree(t, cfg.DataDir, backup)
	backedUp := a.Sequence()

	// Two rotations.
	require.NoError(t, a.Rotate())
	clk.Step(PublishLead * cfg.RefreshHint)
	require.NoError(t, a.Reconcile()) // the successor activates
	require.NoError(t, a.Rotate())
	highest := a.Sequence()
	require.Greater(t, highest, backedUp)
	require.Len(t, a.Roots(), 3)

	// Restore the copy a minute later and start on it.
	clk.Step(time.Minute)
	require.NoError(t, os.RemoveAll(cfg.DataDir))
	copyTree(t, backup, cfg.DataDir)
	cfg.Registerer = prometheus.NewRegistry()
	b, err := New(cfg)
	require.NoError(t, err)
	assert.Len(t, b.Roots(), 1, "the restored state: one root")
	assert.Greater(t, b.Sequence(), highest, "above everything published before the restore")
	assert.Equal(t, uint64(clk.Now().Unix()), b.Sequence(), "the start time")
	seq, ok := b.Bundle().SequenceNumber()
	require.True(t, ok)
	assert.Equal(t, b.Sequence(), seq, "the published bundle carries it")
}

// TestRestartWithTheClockBehind: a clock that went back since the last
// write still moves the sequence forward, by one.
func TestRestartWithTheClockBehind(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	clk.SetTime(t0.Add(-time.Hour))
	cfg.Registerer = prometheus.NewRegistry()
	b, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, a.Sequence()+1, b.Sequence())
}

// TestRaiseSequence: the operator's way past a sequence from a clock that
// once ran ahead. It goes past the sequence given, since peers refuse that
// same sequence with other keys; it never lowers the sequence, refuses a
// number no clock reached, and refuses a data directory without CA state
// instead of creating one.
func TestRaiseSequence(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	ahead := uint64(t0.Add(24 * time.Hour).Unix())

	got, err := RaiseSequence(cfg.DataDir, ahead)
	require.NoError(t, err)
	assert.Equal(t, ahead+1, got, "past the sequence a peer holds")
	got, err = RaiseSequence(cfg.DataDir, 5)
	require.NoError(t, err)
	assert.Equal(t, ahead+1, got, "never lowered")
	got, err = RaiseSequence(cfg.DataDir, ahead)
	require.NoError(t, err)
	assert.Equal(t, ahead+1, got, "already past it: unchanged")
	_, err = RaiseSequence(cfg.DataDir, maxRaise)
	assert.ErrorContains(t, err, "beyond what any clock published")
	got, err = RaiseSequence(cfg.DataDir, 0)
	require.NoError(t, err)
	assert.Equal(t, ahead+1, got)

	require.NoError(t, a.Reload())
	assert.Equal(t, ahead+1, a.Sequence(), "a running server picks the raised sequence up")
	cfg.Registerer = prometheus.NewRegistry()
	b, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, ahead+2, b.Sequence(), "the next start publishes one more")

	missing := filepath.Join(t.TempDir(), "typo")
	_, err = RaiseSequence(missing, ahead)
	require.Error(t, err)
	assert.NoDirExists(t, missing, "nothing created")
}

// TestSnapshot: the state as the loader accepts it, re-encoded; leftovers
// the journal does not name stay out; keys are 0600; a directory without
// state is refused.
func TestSnapshot(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, a.Rotate())
	leftover := filepath.Join(cfg.DataDir, "ca", "roots", "ff.key.pem")
	require.NoError(t, os.WriteFile(leftover, []byte("not named by the journal"), 0o600))

	j, files, err := Snapshot(cfg.DataDir)
	require.NoError(t, err)
	assert.Equal(t, a.Sequence(), j.Sequence)
	require.Len(t, files, 6, "journal, two roots' certificate and key, the JWT key")
	assert.Equal(t, "ca/roots/"+castate.JWTKeyKey(a.JWTKeys()[0].KID), files[5].Name)
	assert.Equal(t, "ca/state.json", files[0].Name)
	restored := t.TempDir()
	for _, f := range files {
		assert.NotContains(t, f.Name, "ff.key.pem")
		p := filepath.Join(restored, filepath.FromSlash(f.Name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, f.Data, f.Mode))
		if strings.HasSuffix(f.Name, ".key.pem") {
			assert.Equal(t, os.FileMode(0o600), f.Mode, f.Name)
		}
	}
	j2, roots, keys, _, err := NewStore(restored).load(tdExample.Name())
	require.NoError(t, err, "the snapshot loads as state")
	assert.Equal(t, j.Sequence, j2.Sequence)
	assert.Len(t, roots, 2)
	require.Len(t, keys, 1, "JWT keys are part of the snapshot")
	assert.Equal(t, a.JWTKeys()[0].KID, keys[0].KID)

	_, _, err = Snapshot(filepath.Join(t.TempDir(), "typo"))
	require.Error(t, err)
	_, _, err = Snapshot(t.TempDir())
	assert.ErrorContains(t, err, "no CA state")
}
