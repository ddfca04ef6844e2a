package backup

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func write(t *testing.T, dir, rel, body string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
	require.NoError(t, os.WriteFile(p, []byte(body), mode))
}

func TestCollect(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "ca/state.json", "{}", 0o600)
	write(t, dir, "ca/.lock", "", 0o600)
	write(t, dir, "trustbridge.lock", "pid 1", 0o600)
	write(t, dir, "federation/peer.example.json", "{}", 0o600)
	write(t, dir, "federation/.peer.example.json.tmp-123", "{", 0o600)
	write(t, dir, "audit.jsonl", "{\"n\":1}\n{\"n\":2}\n{\"n\":", 0o600)
	write(t, dir, "torn.jsonl", "no newline yet", 0o600)
	write(t, dir, "acme/account.key", "k", 0o600)

	files, err := Collect(dir, "ca")
	require.NoError(t, err)
	got := map[string]File{}
	for _, f := range files {
		got[f.Path] = f
	}
	assert.ElementsMatch(t, []string{"federation/peer.example.json", "audit.jsonl", "torn.jsonl", "acme/account.key"}, keys(got),
		"the skipped state dir, lock files and temporary files stay out")
	assert.True(t, got["audit.jsonl"].Log)
	assert.True(t, got["torn.jsonl"].Log)
	assert.False(t, got["acme/account.key"].Log)

	var buf bytes.Buffer
	require.NoError(t, Write(&buf, Manifest{TrustDomain: "example.org"}, files))
	out := t.TempDir()
	_, err = Extract(&buf, out, DefaultLimits)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(out, "audit.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, "{\"n\":1}\n{\"n\":2}\n", string(data), "a log stops after its last complete line")
	data, err = os.ReadFile(filepath.Join(out, "torn.jsonl"))
	require.NoError(t, err)
	assert.Empty(t, data)
	info, err := os.Stat(filepath.Join(out, "acme", "account.key"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
}

func TestCollectRefusesSymlinks(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(outside, []byte("s"), 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "link")))
	_, err := Collect(dir)
	assert.ErrorContains(t, err, "not a regular file")
}

func TestCompleteLinesAcrossChunks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log.jsonl")
	body := make([]byte, 200<<10)
	for i := range body {
		body[i] = 'x'
	}
	body[10] = '\n'
	require.NoError(t, os.WriteFile(p, body, 0o600))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	n, err := completeLines(f, int64(len(body)))
	require.NoError(t, err)
	assert.Equal(t, int64(11), n, "the newline is three chunks back")
}

func keys(m map[string]File) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestInstall(t *testing.T) {
	staged := func(t *testing.T, parent string) string {
		d, err := os.MkdirTemp(parent, ".restore-")
		require.NoError(t, err)
		write(t, d, "ca/state.json", "restored", 0o600)
		return d
	}
	read := func(t *testing.T, dir string) string {
		data, err := os.ReadFile(filepath.Join(dir, "ca", "state.json"))
		require.NoError(t, err)
		return string(data)
	}

	t.Run("missing target", func(t *testing.T) {
		parent := t.TempDir()
		target := filepath.Join(parent, "data")
		replaced, err := Install(staged(t, parent), target, false, t0)
		require.NoError(t, err)
		assert.Empty(t, replaced)
		assert.Equal(t, "restored", read(t, target))
	})
	t.Run("empty target", func(t *testing.T) {
		parent := t.TempDir()
		target := filepath.Join(parent, "data")
		require.NoError(t, os.Mkdir(target, 0o700))
		_, err := Install(staged(t, parent), target, false, t0)
		require.NoError(t, err)
		assert.Equal(t, "restored", read(t, target))
	})
	t.Run("non-empty target is refused and kept", func(t *testing.T) {
		parent := t.TempDir()
		target := filepath.Join(parent, "data")
		write(t, target, "ca/state.json", "current", 0o600)
		_, err := Install(staged(t, parent), target, false, t0)
		require.ErrorIs(t, err, ErrTargetNotEmpty)
		assert.ErrorContains(t, err, "--force")
		assert.Equal(t, "current", read(t, target))
	})
	t.Run("force moves the target aside", func(t *testing.T) {
		parent := t.TempDir()
		target := filepath.Join(parent, "data")
		write(t, target, "ca/state.json", "current", 0o600)
		replaced, err := Install(staged(t, parent), target, true, t0)
		require.NoError(t, err)
		assert.Equal(t, target+".replaced-20260501T120000Z", replaced)
		assert.Equal(t, "restored", read(t, target))
		assert.Equal(t, "current", read(t, replaced), "nothing deleted")
	})
	t.Run("a file is not a target", func(t *testing.T) {
		parent := t.TempDir()
		target := filepath.Join(parent, "data")
		require.NoError(t, os.WriteFile(target, nil, 0o600))
		_, err := Install(staged(t, parent), target, true, t0)
		assert.ErrorContains(t, err, "not a directory")
	})
}
