package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// faultyFile is an *os.File that fails the way a full disk does: a write
// puts down at most room bytes and then fails; Sync and Truncate fail on
// demand.
type faultyFile struct {
	*os.File
	room      int // bytes a write may still put down; < 0: unlimited
	syncErr   error
	truncErr  error
	truncates int
}

func (f *faultyFile) Write(p []byte) (int, error) {
	if f.room < 0 || len(p) <= f.room {
		if f.room >= 0 {
			f.room -= len(p)
		}
		return f.File.Write(p)
	}
	n, err := f.File.Write(p[:f.room])
	f.room = 0
	if err != nil {
		return n, err
	}
	return n, syscall.ENOSPC
}

// Sync fails once, as Linux reports a writeback error to the next fsync
// only.
func (f *faultyFile) Sync() error {
	if err := f.syncErr; err != nil {
		f.syncErr = nil
		return err
	}
	return f.File.Sync()
}

func (f *faultyFile) Truncate(size int64) error {
	f.truncates++
	if f.truncErr != nil {
		return f.truncErr
	}
	return f.File.Truncate(size)
}

// goodLog writes two entries to a new file and returns its path and
// bytes: the last good state every failure must keep.
func goodLog(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path)
	require.NoError(t, err)
	for _, e := range sampleEntries()[:2] {
		require.NoError(t, l.Append(e))
	}
	require.NoError(t, l.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return path, data
}

func openFaulty(t *testing.T, path string) (*Log, *faultyFile) {
	t.Helper()
	osf, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	ff := &faultyFile{File: osf, room: -1}
	l, err := openFile(ff, path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l, ff
}

func verifyFile(t *testing.T, path string) (VerifyResult, error) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	return Verify(f)
}

// A write that fails part-way, or whose sync fails, is truncated away:
// the file is byte for byte the last good state, the error says the entry
// was not written, and the next entry links to the last good one.
func TestAppendUndoesAFailedWrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*faultyFile)
		cause error
	}{
		{"disk full part-way", func(f *faultyFile) { f.room = 40 }, syscall.ENOSPC},
		{"disk full at once", func(f *faultyFile) { f.room = 0 }, syscall.ENOSPC},
		{"sync fails", func(f *faultyFile) { f.syncErr = syscall.EIO }, syscall.EIO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, good := goodLog(t)
			l, ff := openFaulty(t, path)
			head, n := l.Head()

			tc.fault(ff)
			err := l.Append(sampleEntries()[2])
			require.ErrorIs(t, err, tc.cause)
			assert.ErrorContains(t, err, "entry 3 not written; the log is back at entry 2")
			data, rerr := os.ReadFile(path)
			require.NoError(t, rerr)
			assert.Equal(t, string(good), string(data), "the partial entry was truncated away")
			gotHead, gotN := l.Head()
			assert.Equal(t, head, gotHead)
			assert.Equal(t, n, gotN)

			// Space again: the chain goes on from the last good entry.
			ff.room, ff.syncErr = -1, nil
			require.NoError(t, l.Append(sampleEntries()[3]))
			res, err := verifyFile(t, path)
			require.NoError(t, err)
			assert.Equal(t, uint64(3), res.Entries)
			assert.True(t, strings.HasPrefix(mustRead(t, path), string(good)))
		})
	}
}

// When the partial bytes cannot be removed either, nothing more is
// appended (it would follow them and break the chain); reopening moves
// them aside as a torn tail and records that.
func TestAppendStopsWhenAFailedWriteCannotBeUndone(t *testing.T) {
	path, good := goodLog(t)
	l, ff := openFaulty(t, path)
	ff.room, ff.truncErr = 40, syscall.EIO

	err := l.Append(sampleEntries()[2])
	require.ErrorIs(t, err, syscall.ENOSPC)
	assert.ErrorIs(t, err, syscall.EIO)
	assert.ErrorContains(t, err, "partial bytes could not be removed")

	ff.room, ff.truncErr = -1, nil
	err = l.Append(sampleEntries()[3])
	require.ErrorContains(t, err, "nothing more is appended until the log is reopened")
	_, n := l.Head()
	assert.Equal(t, uint64(2), n)
	data := mustRead(t, path)
	assert.Len(t, data, len(good)+40, "the torn bytes, and nothing after them")
	require.NoError(t, l.Close())

	res, err := verifyFile(t, path)
	require.ErrorIs(t, err, ErrTornTail)
	assert.Equal(t, int64(40), res.TornBytes)

	l, err = Open(path)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	res, err = verifyFile(t, path)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), res.Entries, "the two good entries and log_recovered")
	assert.Equal(t, data[len(good):], mustRead(t, l.Recovered()), "the torn bytes are kept")
}

// Open moves a torn final line (a crash cut a write short) into a file of
// its own, byte for byte, warns, and records the recovery in the chain,
// naming that file; the previous head is kept as the recovery entry's
// Prev.
func TestOpenRecoversATornFinalLine(t *testing.T) {
	lines := chain(t)
	whole := strings.Join(lines[:3], "")
	for _, tc := range []struct {
		name string
		tail string
	}{
		{"cut in the middle", lines[3][:50]},
		{"one byte", "{"},
		{"whole entry but its newline", lines[3]},
		{"zero fill", strings.Repeat("\x00", 4096)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			require.NoError(t, os.WriteFile(path, []byte(whole+tc.tail), 0o600))
			before, err := Verify(strings.NewReader(whole))
			require.NoError(t, err)

			var logs testlog.Buffer
			now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
			l, err := Open(path, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithActor("replica-1"), withClock(func() time.Time { return now }))
			require.NoError(t, err)
			head, n := l.Head()
			assert.Equal(t, uint64(4), n)
			require.NoError(t, l.Append(Entry{Event: "root_loaded"}))
			require.NoError(t, l.Close())

			assert.Contains(t, logs.String(), "level=WARN")
			assert.Contains(t, logs.String(), "torn write")
			assert.Contains(t, logs.String(), "torn_bytes="+strconv.Itoa(len(tc.tail)))
			sum := sha256.Sum256([]byte(tc.tail))
			aside := path + ".torn-after-3-" + hex.EncodeToString(sum[:8])
			assert.Equal(t, aside, l.Recovered())
			assert.Contains(t, logs.String(), "torn_file="+aside)
			assert.Equal(t, tc.tail, mustRead(t, aside), "the torn bytes are kept as they were")
			info, err := os.Stat(aside)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

			data := mustRead(t, path)
			require.True(t, strings.HasPrefix(data, whole), "the good entries are kept as they were")
			res, err := Verify(strings.NewReader(data))
			require.NoError(t, err)
			assert.Equal(t, uint64(5), res.Entries)
			rec := decode(t, strings.SplitAfter(data, "\n")[3])
			assert.Equal(t, "log_recovered", rec.Event)
			assert.Equal(t, "replica-1", rec.Actor)
			assert.Equal(t, now, rec.Time)
			assert.Equal(t, before.Head, rec.Prev)
			assert.Contains(t, rec.Reason, "moved a torn final line of "+strconv.Itoa(len(tc.tail))+" bytes")
			assert.Contains(t, rec.Reason, "after entry 3 (head "+before.Head+")")
			assert.Contains(t, rec.Reason, "into "+filepath.Base(aside))
			assert.NotEqual(t, before.Head, head)
		})
	}
}

// Only a torn tail is recovered. A bad line followed by others, or a whole
// final line that fails its hash or link, is evidence: Open refuses and
// leaves the file as it was.
func TestOpenRefusesTamperingNextToATornTail(t *testing.T) {
	lines := chain(t)
	for _, tc := range []struct {
		name, log, want string
	}{
		{"bad middle line, torn tail", lines[0] + "{nope\n" + lines[2] + lines[3][:30], "line 2 is not an audit entry"},
		{"torn-looking middle line", lines[0] + lines[1][:30] + "\n" + lines[2], "line 2 is not an audit entry"},
		{"edited final line", lines[0] + lines[1] + strings.Replace(lines[2], `"actor":"a"`, `"actor":"z"`, 1), "line 3 (seq 3) was edited"},
		{"final line cut short, newline kept", lines[0] + lines[1][:40] + "\n", "line 2 is not an audit entry"},
		{"tail longer than any entry", lines[0] + strings.Repeat("x", MaxLineSize+1), "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			require.NoError(t, os.WriteFile(path, []byte(tc.log), 0o600))
			_, err := Open(path)
			require.ErrorIs(t, err, ErrBroken)
			assert.NotErrorIs(t, err, ErrTornTail)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "move it aside")
			assert.Equal(t, tc.log, mustRead(t, path), "left as it was")
		})
	}
}

// Verify tells a torn tail from tampering, and reports the good part.
func TestVerifyReportsATornTail(t *testing.T) {
	lines := chain(t)
	good := strings.Join(lines[:3], "")
	want, err := Verify(strings.NewReader(good))
	require.NoError(t, err)

	res, err := Verify(strings.NewReader(good + lines[3][:25]))
	require.ErrorIs(t, err, ErrTornTail)
	assert.NotErrorIs(t, err, ErrBroken)
	assert.ErrorContains(t, err, "line 4: 25 bytes after entry 3 end without a newline")
	assert.Equal(t, want.Head, res.Head)
	assert.Equal(t, uint64(3), res.Entries)
	assert.Equal(t, int64(len(good)), res.Bytes)
	assert.Equal(t, int64(25), res.TornBytes)
	assert.Len(t, res.TornSHA256, 64)
}

// When dropping a torn tail fails, Open fails and appends nothing; the
// copy of the torn bytes made first is kept.
func TestOpenFailsWhenATornTailCannotBeDropped(t *testing.T) {
	path, good := goodLog(t)
	torn := append(bytes.Clone(good), `{"seq":3,"ti`...)
	require.NoError(t, os.WriteFile(path, torn, 0o600))
	osf, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	ff := &faultyFile{File: osf, room: -1, truncErr: syscall.EROFS}
	_, openErr := openFile(ff, path)
	require.ErrorIs(t, openErr, syscall.EROFS)
	assert.ErrorContains(t, openErr, "dropping its torn final line (12 bytes after entry 2)")
	assert.Equal(t, string(torn), mustRead(t, path))
	copies, err := filepath.Glob(path + TornTailSuffix + "*")
	require.NoError(t, err)
	require.Len(t, copies, 1)
	assert.ErrorContains(t, openErr, "a copy of which is in "+copies[0])
	assert.Equal(t, `{"seq":3,"ti`, mustRead(t, copies[0]))

	// And when recording the recovery fails, the tail is gone but the
	// chain is whole: the next Open finds nothing to recover.
	osf, err = os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	ff = &faultyFile{File: osf, room: 10}
	_, err = openFile(ff, path)
	require.ErrorIs(t, err, syscall.ENOSPC)
	assert.ErrorContains(t, err, "recording the recovery")
	assert.ErrorContains(t, err, "kept in "+copies[0])
	assert.Equal(t, string(good), mustRead(t, path))
	assert.Equal(t, `{"seq":3,"ti`, mustRead(t, copies[0]), "found again, kept as it was")
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(data)
}

// A copy an earlier start made and could not finish with is found again
// when it holds the same bytes; one holding other bytes is never
// overwritten, and the log is left as it was.
func TestOpenKeepsAnEarlierCopyOfATornTail(t *testing.T) {
	path, good := goodLog(t)
	tail := `{"seq":3,"ti`
	require.NoError(t, os.WriteFile(path, append(bytes.Clone(good), tail...), 0o600))
	sum := sha256.Sum256([]byte(tail))
	aside := path + TornTailSuffix + "2-" + hex.EncodeToString(sum[:8])

	require.NoError(t, os.WriteFile(aside, []byte("other bytes"), 0o600))
	_, err := Open(path)
	require.ErrorContains(t, err, aside+" exists and holds other bytes; move it away")
	assert.Equal(t, string(good)+tail, mustRead(t, path), "the log is left as it was")
	assert.Equal(t, "other bytes", mustRead(t, aside))

	require.NoError(t, os.WriteFile(aside, []byte(tail), 0o600))
	l, err := Open(path)
	require.NoError(t, err)
	assert.Equal(t, aside, l.Recovered())
	require.NoError(t, l.Close())
	res, err := verifyFile(t, path)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), res.Entries)
	assert.Equal(t, tail, mustRead(t, aside))
}
