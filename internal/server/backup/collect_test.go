package backup

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/datadir"
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
	write(t, dir, "admin.token", "t", 0o600)
	// A running server's --admin-socket in the data directory.
	sock, err := net.Listen("unix", filepath.Join(dir, "admin.sock"))
	require.NoError(t, err)
	defer sock.Close()

	files, err := Collect(dir, "ca", "admin.token")
	require.NoError(t, err)
	got := map[string]File{}
	for _, f := range files {
		got[f.Path] = f
	}
	assert.ElementsMatch(t, []string{"federation/peer.example.json", "audit.jsonl", "torn.jsonl", "acme/account.key"}, keys(got),
		"the skipped state dir and file, lock files, sockets and temporary files stay out")
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

// inPlaceTarget is a data directory with old state, a lost+found and a
// staging directory inside it, as a restore onto a mount point has.
func inPlaceTarget(t *testing.T, rename func(string, string) error) (*Target, string) {
	t.Helper()
	target := filepath.Join(t.TempDir(), "data")
	write(t, target, "ca/state.json", "current", 0o600)
	write(t, target, "audit.jsonl", "old log\n", 0o600)
	require.NoError(t, os.Mkdir(filepath.Join(target, "lost+found"), 0o700))
	write(t, target, "lost+found/#123", "fsck found this", 0o600)
	tg, err := OpenTarget(target, TargetOptions{Force: true, Commit: "ca", Command: "test", inPlace: true, rename: rename})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tg.Release() })
	staged, err := tg.StageDir()
	require.NoError(t, err)
	rel, ok := Inside(target, staged)
	require.True(t, ok, "staged inside the target, on its file system")
	assert.NotContains(t, rel, string(filepath.Separator))
	write(t, staged, "ca/state.json", "restored", 0o600)
	write(t, staged, "federation/peer.json", "{}", 0o600)
	return tg, staged
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

// TestInstallInPlace: a target that must keep its place (a mount point)
// keeps it; its old entries move into DIR/replaced-<time>, lost+found
// stays, nothing is deleted and the staging directory is gone.
func TestInstallInPlace(t *testing.T) {
	var moves []string
	tg, _ := inPlaceTarget(t, func(from, to string) error {
		moves = append(moves, filepath.Base(from))
		return os.Rename(from, to)
	})
	target := tg.dir
	before, err := os.Stat(target)
	require.NoError(t, err)
	replaced, err := tg.Install(mustStaged(t, target), t0)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(target, "replaced-20260501T120000Z"), replaced)
	after, err := os.Stat(target)
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "the directory itself stayed")
	assert.ElementsMatch(t, []string{"ca", "federation", "lost+found", "trustbridge.lock", "replaced-20260501T120000Z"}, names(t, target))
	got, err := os.ReadFile(filepath.Join(target, "ca", "state.json"))
	require.NoError(t, err)
	assert.Equal(t, "restored", string(got))
	got, err = os.ReadFile(filepath.Join(replaced, "ca", "state.json"))
	require.NoError(t, err)
	assert.Equal(t, "current", string(got), "nothing deleted")
	assert.FileExists(t, filepath.Join(replaced, "audit.jsonl"))
	assert.FileExists(t, filepath.Join(target, "lost+found", "#123"), "lost+found stays in place")
	assert.Equal(t, []string{"ca", "audit.jsonl", "federation", "ca"}, moves, "the CA state moves aside first and in last")
}

// mustStaged finds the one staging directory inside target.
func mustStaged(t *testing.T, target string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(target, ".restore-*"))
	require.NoError(t, err)
	require.Len(t, m, 1)
	return m[0]
}

// TestInstallInPlaceUndoesAFailedMove: a move that fails half way is
// undone; the target is as it was.
func TestInstallInPlaceUndoesAFailedMove(t *testing.T) {
	tg, staged := inPlaceTarget(t, func(from, to string) error {
		if filepath.Base(from) == "ca" && strings.HasPrefix(filepath.Base(filepath.Dir(from)), ".restore-") {
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EIO}
		}
		return os.Rename(from, to)
	})
	_, err := tg.Install(staged, t0)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrHalfway)
	assert.ErrorContains(t, err, "every entry was moved back")
	assert.ElementsMatch(t, []string{"ca", "audit.jsonl", "lost+found", "trustbridge.lock", filepath.Base(staged)}, names(t, tg.dir))
	got, err := os.ReadFile(filepath.Join(tg.dir, "ca", "state.json"))
	require.NoError(t, err)
	assert.Equal(t, "current", string(got))
	assert.ElementsMatch(t, []string{"ca", "federation"}, names(t, staged), "the staging directory is whole again")
}

// TestInstallInPlaceHalfWay: when undoing fails too, the error wraps
// ErrHalfway and says where every entry is; nothing is deleted.
func TestInstallInPlaceHalfWay(t *testing.T) {
	failing := false
	tg, staged := inPlaceTarget(t, func(from, to string) error {
		if failing {
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EIO}
		}
		if filepath.Base(from) == "ca" && strings.HasPrefix(filepath.Base(filepath.Dir(from)), ".restore-") {
			failing = true // the disk goes bad
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EIO}
		}
		return os.Rename(from, to)
	})
	replaced := filepath.Join(tg.dir, "replaced-20260501T120000Z")
	_, err := tg.Install(staged, t0)
	require.ErrorIs(t, err, ErrHalfway)
	assert.ErrorContains(t, err, "the data directory "+tg.dir+" holds federation")
	assert.ErrorContains(t, err, "the moved-aside directory "+replaced+" holds audit.jsonl, ca")
	assert.ErrorContains(t, err, "the staging directory "+staged+" holds ca")
	assert.ErrorContains(t, err, "nothing was deleted")
	got, err := os.ReadFile(filepath.Join(replaced, "ca", "state.json"))
	require.NoError(t, err)
	assert.Equal(t, "current", string(got))
}

// TestOpenTargetIgnoresLostFound: a volume's lost+found does not make the
// target non-empty, and stays in place.
func TestOpenTargetIgnoresLostFound(t *testing.T) {
	parent := t.TempDir()
	target := filepath.Join(parent, "data")
	require.NoError(t, os.MkdirAll(filepath.Join(target, "lost+found"), 0o700))
	staged, err := os.MkdirTemp(parent, ".restore-")
	require.NoError(t, err)
	write(t, staged, "ca/state.json", "restored", 0o600)
	replaced, err := Install(staged, target, false, t0)
	require.NoError(t, err, "no --force needed")
	assert.Empty(t, replaced)
	assert.ElementsMatch(t, []string{"ca", "lost+found", "trustbridge.lock"}, names(t, target))
	assert.NoDirExists(t, staged)
}

// TestOpenTargetHoldsTheLock: from OpenTarget to Release the target is
// locked, naming the restore, so a server starting in between is refused;
// a missing target is locked through the staging directory.
func TestOpenTargetHoldsTheLock(t *testing.T) {
	target := filepath.Join(t.TempDir(), "data")
	write(t, target, "ca/state.json", "current", 0o600)
	tg, err := OpenTarget(target, TargetOptions{Force: true, Command: "trustbridge restore"})
	require.NoError(t, err)
	h, held, err := datadir.Probe(target)
	require.NoError(t, err)
	require.True(t, held, "held from the check on")
	assert.Equal(t, "trustbridge restore", h.Command)
	_, err = datadir.Acquire(target, datadir.Self("trustbridge server"))
	assert.ErrorContains(t, err, "(trustbridge restore)", "a server starting now is refused, naming the restore")
	staged, err := tg.StageDir()
	require.NoError(t, err)
	write(t, staged, "ca/state.json", "restored", 0o600)
	_, err = tg.Install(staged, t0)
	require.NoError(t, err)
	_, held, err = datadir.Probe(target + ".replaced-20260501T120000Z")
	require.NoError(t, err)
	assert.True(t, held, "the moved-aside directory's lock is still ours")
	require.NoError(t, tg.Release())
	_, held, err = datadir.Probe(target)
	require.NoError(t, err)
	assert.False(t, held)
}
