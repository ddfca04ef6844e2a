package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server/backup"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// backedUpDataDir is a data dir a server ran on once, with a federated
// last-known-good bundle, a consumed-token ledger and an audit log next to
// the CA state, and its archive.
func backedUpDataDir(t *testing.T) (dataDir, archive string) {
	t.Helper()
	dataDir, _ = bootstrapDataDir(t, "east.example")
	peer := testca.New(t, "west.example")
	require.NoError(t, federation.NewLKGStore(dataDir).Save(federation.LKGEntry{
		TrustDomain: peer.TrustDomain, Bundle: peer.Bundle(), EndpointURL: "https://west.example/bundle", FetchedAt: time.Now().Truncate(time.Second),
	}))
	ledger, err := authn.OpenFileLedger(filepath.Join(dataDir, authn.LedgerFileName))
	require.NoError(t, err)
	require.NoError(t, ledger.Consume(context.Background(), authn.Consumption{
		Ref: authn.BootstrapGrantRef(sha256.Sum256([]byte("laptop-token"))), ID: spiffeid.RequireFromString("spiffe://east.example/vm/laptop"), At: time.Now().Truncate(time.Second),
	}))
	archive = filepath.Join(t.TempDir(), "b.tar.gz")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "backup", "--data-dir", dataDir, "--out", archive)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "backed up trust domain east.example")
	return dataDir, archive
}

func TestBackupRestoreRoundTrip(t *testing.T) {
	dataDir, archive := backedUpDataDir(t)
	target := filepath.Join(t.TempDir(), "restored")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "restore", "--data-dir", target, "--from", archive)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "restored trust domain east.example into "+target)
	assert.NotContains(t, stdout, "previous contents", "nothing was there to move aside")
	assert.FileExists(t, filepath.Join(dataDir, "ca", ".lock"))
	assert.NoFileExists(t, filepath.Join(target, "ca", ".lock"), "lock files are not state")

	want, _, err := ca.Snapshot(dataDir)
	require.NoError(t, err)
	got, files, err := ca.Snapshot(target)
	require.NoError(t, err)
	assert.Equal(t, want.Sequence, got.Sequence)
	assert.Equal(t, want.Roots, got.Roots)
	require.Len(t, got.JWTKeys, 1, "the JWT signing key is restored")
	assert.Equal(t, want.JWTKeys, got.JWTKeys)
	jwtKeyFile := filepath.Join(target, "ca", "roots", castate.JWTKeyKey(got.JWTKeys[0].KID))
	require.FileExists(t, jwtKeyFile)
	restoredKey, err := os.ReadFile(jwtKeyFile)
	require.NoError(t, err)
	origKey, err := os.ReadFile(filepath.Join(dataDir, "ca", "roots", castate.JWTKeyKey(got.JWTKeys[0].KID)))
	require.NoError(t, err)
	assert.Equal(t, origKey, restoredKey, "the same key signs after a restore")
	for _, f := range files {
		info, err := os.Stat(filepath.Join(target, filepath.FromSlash(f.Name)))
		require.NoError(t, err)
		assert.Equal(t, f.Mode, info.Mode().Perm(), f.Name)
	}
	for _, rel := range []string{"federation/west.example.json", "audit.jsonl", authn.LedgerFileName} {
		w, err := os.ReadFile(filepath.Join(dataDir, rel))
		require.NoError(t, err)
		g, err := os.ReadFile(filepath.Join(target, rel))
		require.NoError(t, err, rel)
		assert.Equal(t, w, g, rel)
	}
	info, err := os.Stat(target)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), info.Mode().Perm())

	// The consumed token stays consumed: a restore does not make it usable
	// again.
	ledger, err := authn.OpenFileLedger(filepath.Join(target, authn.LedgerFileName))
	require.NoError(t, err)
	_, consumed, err := ledger.Consumed(context.Background(), authn.BootstrapGrantRef(sha256.Sum256([]byte("laptop-token"))))
	require.NoError(t, err)
	assert.True(t, consumed)
	lkg, err := federation.NewLKGStore(target).Load(spiffeid.RequireTrustDomainFromString("west.example"))
	require.NoError(t, err)
	require.NotNil(t, lkg)
	assert.Equal(t, "https://west.example/bundle", lkg.EndpointURL)
}

func TestBackupAndRestoreThroughPipes(t *testing.T) {
	dataDir, _ := bootstrapDataDir(t, "east.example")
	var out, errb bytes.Buffer
	code := run([]string{"backup", "--data-dir", dataDir, "--out", "-"}, cli.Env{In: strings.NewReader(""), Out: &out, Err: &errb, Now: time.Now})
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, errb.String(), "backed up trust domain east.example", "the report goes to stderr, the archive to stdout")

	target := filepath.Join(t.TempDir(), "restored")
	_, stderr, code := runCLIAt(t, time.Now, out.String(), "restore", "--data-dir", target, "--from", "-")
	require.Equal(t, 0, code, stderr)
	_, _, err := ca.Snapshot(target)
	assert.NoError(t, err)
}

func TestBackupRefuses(t *testing.T) {
	dataDir, _ := bootstrapDataDir(t, "east.example")
	existing := filepath.Join(t.TempDir(), "old.tar.gz")
	require.NoError(t, os.WriteFile(existing, []byte("an earlier backup"), 0o600))
	typo := filepath.Join(t.TempDir(), "dtaa")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no state: a mistyped data dir", []string{"--data-dir", typo, "--out", filepath.Join(t.TempDir(), "x.tar.gz")}, "no CA state"},
		{"an empty data dir", []string{"--data-dir", t.TempDir(), "--out", filepath.Join(t.TempDir(), "x.tar.gz")}, "no CA state"},
		{"archive inside the data dir", []string{"--data-dir", dataDir, "--out", filepath.Join(dataDir, "b.tar.gz")}, "inside --data-dir"},
		{"an existing archive", []string{"--data-dir", dataDir, "--out", existing}, "never overwrites"},
		{"no --out", []string{"--data-dir", dataDir}, `"out" not set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runCLIAt(t, time.Now, "", append([]string{"backup"}, tc.args...)...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tc.want)
		})
	}
	assert.NoDirExists(t, typo, "backup creates no data dir")
	data, err := os.ReadFile(existing)
	require.NoError(t, err)
	assert.Equal(t, "an earlier backup", string(data))
	assert.NoFileExists(t, filepath.Join(dataDir, "b.tar.gz"))
}

// TestRestoreRefusesAndKeepsTheTarget: every refusal leaves the target as
// it was and no staging directory behind.
func TestRestoreRefusesAndKeepsTheTarget(t *testing.T) {
	dataDir, archive := backedUpDataDir(t)
	good, err := os.ReadFile(archive)
	require.NoError(t, err)
	tampered := append([]byte(nil), good...)
	tampered[len(tampered)/2] ^= 0xff
	write := func(name string, data []byte) string {
		p := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	// A well-formed archive whose CA state does not load: the journal
	// names a root whose files are not in it.
	j, files, err := ca.Snapshot(dataDir)
	require.NoError(t, err)
	var broken bytes.Buffer
	require.NoError(t, backup.Write(&broken, backup.Manifest{TrustDomain: "east.example", Sequence: j.Sequence, Created: time.Now()},
		[]backup.File{{Path: files[0].Name, Mode: files[0].Mode, Data: files[0].Data}}))
	var otherSeq bytes.Buffer
	all := make([]backup.File, 0, len(files))
	for _, f := range files {
		all = append(all, backup.File{Path: f.Name, Mode: f.Mode, Data: f.Data})
	}
	require.NoError(t, backup.Write(&otherSeq, backup.Manifest{TrustDomain: "east.example", Sequence: j.Sequence + 1, Created: time.Now()}, all))
	var otherTD bytes.Buffer
	require.NoError(t, backup.Write(&otherTD, backup.Manifest{TrustDomain: "west.example", Sequence: j.Sequence, Created: time.Now()}, all))
	// Well-formed archives with a valid CA state and a corrupt ledger or
	// last-known-good bundle: refused before anything moves.
	var badLedger, badLKG bytes.Buffer
	require.NoError(t, backup.Write(&badLedger, backup.Manifest{TrustDomain: "east.example", Sequence: j.Sequence, Created: time.Now()},
		append(all[:len(all):len(all)], backup.File{Path: authn.LedgerFileName, Mode: 0o600, Data: []byte(`{"version":1,"consumed":{"ref`)})))
	require.NoError(t, backup.Write(&badLKG, backup.Manifest{TrustDomain: "east.example", Sequence: j.Sequence, Created: time.Now()},
		append(all[:len(all):len(all)], backup.File{Path: "federation/west.example.json", Mode: 0o600, Data: []byte(`{"trust_domain":"west.example"}`)})))

	for _, tc := range []struct {
		name    string
		archive string
		force   bool
		want    string
	}{
		{"non-empty target without --force", archive, false, "--force"},
		{"tampered archive", write("t.tar.gz", tampered), true, "invalid backup archive"},
		{"truncated archive", write("c.tar.gz", good[:len(good)/2]), true, "invalid backup archive"},
		{"CA state that does not load", write("b.tar.gz", broken.Bytes()), true, "does not load"},
		{"manifest and state disagree on the sequence", write("s.tar.gz", otherSeq.Bytes()), true, "the manifest says sequence"},
		{"manifest of another trust domain", write("d.tar.gz", otherTD.Bytes()), true, "does not load"},
		{"corrupt consumed-token ledger", write("l.tar.gz", badLedger.Bytes()), true, "the archived consumed-token ledger does not load"},
		{"corrupt last-known-good bundle", write("f.tar.gz", badLKG.Bytes()), true, "an archived last-known-good bundle does not load"},
		{"missing archive", filepath.Join(t.TempDir(), "none.tar.gz"), true, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, before, err := ca.Snapshot(dataDir)
			require.NoError(t, err)
			args := []string{"restore", "--data-dir", dataDir, "--from", tc.archive}
			if tc.force {
				args = append(args, "--force")
			}
			_, stderr, code := runCLIAt(t, time.Now, "", args...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tc.want)
			_, after, err := ca.Snapshot(dataDir)
			require.NoError(t, err)
			assert.Equal(t, before, after, "the target is untouched")
			for _, pattern := range []string{"." + filepath.Base(dataDir) + ".restore-*", filepath.Base(dataDir) + ".replaced-*"} {
				left, err := filepath.Glob(filepath.Join(filepath.Dir(dataDir), pattern))
				require.NoError(t, err)
				assert.Empty(t, left, "no staging directory or moved-aside copy is left behind")
			}
		})
	}
}

func TestRestoreForceMovesTheTargetAside(t *testing.T) {
	dataDir, archive := backedUpDataDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "newer.txt"), []byte("written after the backup"), 0o600))
	stdout, stderr, code := runCLIAt(t, time.Now, "", "restore", "--data-dir", dataDir, "--from", archive, "--force")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "the previous contents of "+dataDir+" are in "+dataDir+".replaced-")
	assert.NoFileExists(t, filepath.Join(dataDir, "newer.txt"))
	moved, err := filepath.Glob(dataDir + ".replaced-*")
	require.NoError(t, err)
	require.Len(t, moved, 1)
	data, err := os.ReadFile(filepath.Join(moved[0], "newer.txt"))
	require.NoError(t, err)
	assert.Equal(t, "written after the backup", string(data), "nothing deleted")
}

// TestRestoreSequenceAbove: the way past a sequence peers hold from a
// clock that ran ahead: the restored state goes one past it, and the
// server's start publishes one more again.
func TestRestoreSequenceAbove(t *testing.T) {
	_, archive := backedUpDataDir(t)
	target := filepath.Join(t.TempDir(), "restored")
	ahead := uint64(time.Now().Add(365 * 24 * time.Hour).Unix())
	stdout, stderr, code := runCLIAt(t, time.Now, "", "restore", "--data-dir", target, "--from", archive,
		"--sequence-above", strconv.FormatUint(ahead, 10))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "sequence "+strconv.FormatUint(ahead+1, 10))
	s := startE2EServer(t, "east.example", target, nil)
	assert.Equal(t, ahead+2, servedSequence(t, s))
}

// TestCARaiseSequenceWhileServing: a running server publishes the raised
// sequence, one past the one given, at its next check, and never a lower
// one.
func TestCARaiseSequenceWhileServing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the server's CA recheck (up to 30s)")
	}
	dataDir, _ := bootstrapDataDir(t, "east.example")
	s := startE2EServer(t, "east.example", dataDir, nil)
	ahead := servedSequence(t, s) + 1_000_000
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "raise-sequence", "--data-dir", dataDir, "--above", strconv.FormatUint(ahead, 10))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "holds sequence "+strconv.FormatUint(ahead+1, 10))
	assert.Eventually(t, func() bool { return servedSequence(t, s) == ahead+1 }, 60*time.Second, 100*time.Millisecond)

	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "raise-sequence", "--data-dir", dataDir, "--above", "5")
	require.Equal(t, 0, code, stderr)
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "raise-sequence", "--data-dir", dataDir)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--above is required")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "raise-sequence", "--data-dir", dataDir, "--above", "18446744073709551615")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "beyond what any clock published")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "raise-sequence", "--data-dir", filepath.Join(t.TempDir(), "typo"), "--above", "5")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "no CA state")
	assert.Equal(t, ahead+1, servedSequence(t, s), "never lowered")
}

// backup reads a data directory it cannot write to (a read-only mount,
// a snapshot): the CA state's shared lock needs no write access. Made
// immutable (chattr +i), the lock file and directories refuse writes even
// to root, which tests often run as.
func TestBackupOfReadOnlyDataDir(t *testing.T) {
	dataDir, _ := bootstrapDataDir(t, "east.example")
	lock := filepath.Join(dataDir, "ca", ".lock")
	require.FileExists(t, lock, "the server's lock file, as a snapshot holds it")
	frozen := []string{lock, filepath.Join(dataDir, "ca"), dataDir}
	if out, err := exec.Command("chattr", append([]string{"+i"}, frozen...)...).CombinedOutput(); err != nil {
		t.Skipf("cannot make the data dir immutable (chattr +i needs CAP_LINUX_IMMUTABLE and a file system that has it): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", append([]string{"-i"}, frozen...)...).Run() })
	_, err := os.OpenFile(lock, os.O_RDWR, 0)
	require.Error(t, err, "the lock file cannot be opened for writing")

	archive := filepath.Join(t.TempDir(), "b.tar.gz")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "backup", "--data-dir", dataDir, "--out", archive)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "backed up trust domain east.example")
}
