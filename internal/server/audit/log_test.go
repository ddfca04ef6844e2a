package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/datadir"
)

func u64(v uint64) *uint64 { return &v }

func sampleEntries() []Entry {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	return []Entry{
		{Time: t0, Actor: "a", Event: "root_prepared", TrustDomain: "east.example", NewSequence: u64(2), Added: []string{"x509:aa"}},
		{Time: t0.Add(time.Minute), Actor: "a", Event: "bundle_accepted", TrustDomain: "west.example", SourceURL: "https://west.example/",
			OldSequence: u64(3), NewSequence: u64(4), Added: []string{"x509:bb"}, Removed: []string{"x509:cc"}},
		{Time: t0.Add(2 * time.Minute), Actor: "a", Event: "bundle_rejected", TrustDomain: "west.example", Reason: "sequence_regression"},
		{Time: t0.Add(3 * time.Minute), Actor: "b", Event: "endpoint_removed", TrustDomain: "west.example"},
	}
}

func chain(t *testing.T) []string {
	t.Helper()
	var buf bytes.Buffer
	l := New(&buf)
	for _, e := range sampleEntries() {
		require.NoError(t, l.Append(e))
	}
	return strings.SplitAfter(strings.TrimSuffix(buf.String(), "\n"), "\n")
}

func TestChainVerifies(t *testing.T) {
	lines := chain(t)
	require.Len(t, lines, 4)
	res, err := Verify(strings.NewReader(strings.Join(lines, "") + "\n"))
	require.NoError(t, err)
	assert.Equal(t, uint64(4), res.Entries)
	assert.Len(t, res.Head, 64)
	assert.Equal(t, time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), res.First)

	empty, err := Verify(strings.NewReader(""))
	require.NoError(t, err)
	assert.Zero(t, empty.Entries)
}

// Every way of tampering with a chain but cutting its tail is found, and
// the error names the line.
func TestVerifyDetectsTampering(t *testing.T) {
	lines := chain(t)
	join := func(ls ...string) string { return strings.Join(ls, "") + "\n" }
	for _, tc := range []struct {
		name, log, want string
	}{
		{"edited field", join(lines[0], strings.Replace(lines[1], `"new_sequence":4`, `"new_sequence":5`, 1), lines[2], lines[3]), "line 2 (seq 2) was edited"},
		{"edited last entry", join(lines[0], lines[1], lines[2], strings.Replace(lines[3], `"actor":"b"`, `"actor":"c"`, 1)), "line 4 (seq 4) was edited"},
		{"edited and rehashed", join(lines[0], rehash(t, strings.Replace(lines[1], `x509:bb`, `x509:ee`, 1)), lines[2], lines[3]), "line 3 (seq 3) does not follow"},
		{"dropped", join(lines[0], lines[2], lines[3]), "line 2 (seq 3) does not follow line 1"},
		{"dropped first", join(lines[1], lines[2], lines[3]), "line 1 (seq 2) does not follow"},
		{"reordered", join(lines[0], lines[2], lines[1], lines[3]), "line 2 (seq 3) does not follow"},
		{"duplicated", join(lines[0], lines[1], lines[1], lines[2]), "line 3 (seq 2) does not follow"},
		{"not json", join(lines[0], "{nope\n"), "line 2 is not an audit entry"},
		{"unknown field", join(strings.Replace(lines[0], `{"seq"`, `{"x":1,"seq"`, 1)), "line 1 is not an audit entry"},
		{"key case changed", join(lines[0], strings.Replace(lines[1], `"actor"`, `"ACTOR"`, 1), lines[2], lines[3]), "line 2 (seq 2) was edited: its bytes"},
		{"space added to the last line", join(lines[0], lines[1], lines[2], strings.Replace(lines[3], `,"prev"`, `, "prev"`, 1)), "line 4 (seq 4) was edited: its bytes"},
		{"bad line before a torn tail", join(lines[0], "{nope\n") + lines[1][:20], "line 2 is not an audit entry"},
		{"final line with its newline but cut short", join(lines[0], lines[1][:30]), "line 2 is not an audit entry"},
		{"torn tail longer than an entry", lines[0] + strings.Repeat("x", MaxLineSize+1), "line 2: longer than"},
		{"huge line", join(lines[0], strings.Repeat("x", MaxLineSize+1)), "line 2: longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Verify(strings.NewReader(tc.log))
			require.ErrorIs(t, err, ErrBroken)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// rehash recomputes an edited entry's own hash, as a forger would: the
// next entry's link still gives it away.
func rehash(t *testing.T, line string) string {
	t.Helper()
	var buf bytes.Buffer
	e := decode(t, line)
	h, err := contentHash(e)
	require.NoError(t, err)
	e.Hash = h
	require.NoError(t, encodeLine(&buf, e))
	return buf.String()
}

func TestOpenContinuesTheChain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path)
	require.NoError(t, err)
	entries := sampleEntries()
	require.NoError(t, l.Append(entries[0]))
	require.NoError(t, l.Append(entries[1]))
	require.NoError(t, l.Close())
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	l, err = Open(path)
	require.NoError(t, err)
	head, n := l.Head()
	assert.Equal(t, uint64(2), n)
	require.NoError(t, l.Append(entries[2]))
	require.NoError(t, l.Close())

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	res, err := Verify(f)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), res.Entries)
	assert.NotEqual(t, head, res.Head)
}

// A chain that does not verify is evidence: nothing is appended to it,
// and the error says what to do.
func TestOpenRefusesABrokenChain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	lines := chain(t)
	require.NoError(t, os.WriteFile(path, []byte(lines[0]+lines[2]+"\n"), 0o600))
	_, err := Open(path)
	require.ErrorIs(t, err, ErrBroken)
	assert.ErrorContains(t, err, "move it aside")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, lines[0]+lines[2]+"\n", string(data), "left as it was")
}

func TestOpenTightensPermissions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	l, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
}

func TestAppendRefusesHugeEntries(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf)
	err := l.Append(Entry{Event: "x", Reason: strings.Repeat("r", MaxLineSize)})
	assert.ErrorContains(t, err, "exceeds")
	assert.Zero(t, buf.Len())
	require.NoError(t, l.Append(Entry{Event: "x"}))
	res, err := Verify(&buf)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), res.Entries, "the refused entry took no place in the chain")
}

func FuzzVerify(f *testing.F) {
	var buf bytes.Buffer
	l := New(&buf)
	for _, e := range sampleEntries() {
		_ = l.Append(e)
	}
	f.Add(buf.Bytes())
	f.Add([]byte("{}\n"))
	f.Add([]byte(""))
	f.Add([]byte("\n\n"))
	f.Add(buf.Bytes()[:buf.Len()-7])
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Verify(bytes.NewReader(data))
		if errors.Is(err, ErrTornTail) {
			// A torn tail is only ever the bytes after the entries that
			// verify, and those verify alone with the same head.
			if res.Bytes+res.TornBytes != int64(len(data)) || bytes.HasSuffix(data, []byte("\n")) {
				t.Fatalf("torn tail of %d bytes after %d verified, in %d bytes", res.TornBytes, res.Bytes, len(data))
			}
			again, err := Verify(bytes.NewReader(data[:res.Bytes]))
			if err != nil || again.Head != res.Head || again.Entries != res.Entries {
				t.Fatalf("the part before a torn tail does not verify alone: %v", err)
			}
			return
		}
		if err != nil {
			return
		}
		if res.Bytes != int64(len(data)) {
			t.Fatalf("verified %d bytes of %d", res.Bytes, len(data))
		}
		// What verifies is a chain: re-appending its entries to a new log
		// gives the same head.
		var again bytes.Buffer
		l := New(&again)
		for _, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			e := decode(t, string(line))
			e.Seq, e.Prev, e.Hash = 0, "", ""
			if err := l.Append(e); err != nil {
				t.Fatal(err)
			}
		}
		head, n := l.Head()
		if n != res.Entries || head != res.Head {
			t.Fatalf("re-appended chain: %d entries, head %s; verified: %d, %s", n, head, res.Entries, res.Head)
		}
	})
}

func decode(t *testing.T, line string) Entry {
	t.Helper()
	var e Entry
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSuffix(line, "\n")), &e))
	return e
}

func encodeLine(buf *bytes.Buffer, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	buf.Write(append(b, '\n'))
	return nil
}

// One writer per log: a second Open of the same file, in this process or
// another, is refused while the first is open, and allowed after Close.
func TestOpenRefusesASecondWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, l.Append(sampleEntries()[0]))

	_, err = Open(path)
	require.ErrorIs(t, err, datadir.ErrHeld)
	assert.ErrorContains(t, err, path+" is being appended to by another process")
	res, err := verifyFile(t, path)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), res.Entries, "the refused writer changed nothing")

	require.NoError(t, l.Close())
	l, err = Open(path)
	require.NoError(t, err)
	require.NoError(t, l.Close())
}

// Entries are appended with O_APPEND: wherever the file's offset stands,
// an entry lands after the last one and never overwrites it.
func TestAppendWritesAtTheEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path)
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, l.Append(sampleEntries()[0]))
	before := mustRead(t, path)

	_, err = l.file.Seek(0, io.SeekStart)
	require.NoError(t, err)
	require.NoError(t, l.Append(sampleEntries()[1]))
	after := mustRead(t, path)
	assert.True(t, strings.HasPrefix(after, before), "the first entry is intact")
	res, err := verifyFile(t, path)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), res.Entries)
}
