package backup

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func testManifest() Manifest {
	return Manifest{TrustDomain: "example.org", Created: t0, Sequence: 1777636800, Version: "test"}
}

func TestWriteExtractRoundTrip(t *testing.T) {
	src := t.TempDir()
	log := filepath.Join(src, "audit.jsonl")
	require.NoError(t, os.WriteFile(log, []byte("{\"a\":1}\n{\"a\":"), 0o600))
	files := []File{
		{Path: "ca/state.json", Mode: 0o600, Data: []byte(`{"sequence":1}`)},
		{Path: "ca/roots/ab.crt.pem", Mode: 0o644, Data: []byte("cert")},
		{Path: "ca/roots/ab.key.pem", Mode: 0o600, Data: []byte("key")},
		{Path: "audit.jsonl", Mode: 0o600, Source: log, Log: true}, // the complete line only
		{Path: "empty", Mode: 0o644, Data: []byte{}},
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, testManifest(), files))

	dir := t.TempDir()
	m, err := Extract(bytes.NewReader(buf.Bytes()), dir, DefaultLimits)
	require.NoError(t, err)
	want := testManifest()
	want.Format = Format
	assert.Equal(t, want, *m)
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		got, err := os.ReadFile(p)
		require.NoError(t, err, f.Path)
		if f.Data != nil {
			assert.Equal(t, f.Data, got, f.Path)
		}
		info, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, f.Mode, info.Mode().Perm(), f.Path)
	}
	got, err := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, "{\"a\":1}\n", string(got))
}

// TestWriteArchivesTheFileAsOpened: the token ledger and the
// last-known-good bundles are replaced by rename while the server runs. A
// file replaced between Collect's listing and Write's copy, by a larger or
// a smaller one, is archived whole as the new file, with a checksum of the
// new bytes: never a truncated copy whose checksum matches the truncation,
// never "file shrank".
func TestWriteArchivesTheFileAsOpened(t *testing.T) {
	for _, tc := range []struct{ name, before, after string }{
		{"grew", `{"version":1,"consumed":{}}`, `{"version":1,"consumed":{"ref-a":{"spiffe_id":"spiffe://example.org/vm/a"}}}`},
		{"shrank", `{"version":1,"consumed":{"ref-a":{"spiffe_id":"spiffe://example.org/vm/a"}}}`, `{"version":1,"consumed":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "bootstrap-tokens-consumed.json", tc.before, 0o600)
			files, err := Collect(dir)
			require.NoError(t, err)
			// The server consumes a token: atomic write, temporary file
			// renamed over the old one.
			write(t, dir, ".new.tmp-1", tc.after, 0o600)
			require.NoError(t, os.Rename(filepath.Join(dir, ".new.tmp-1"), filepath.Join(dir, "bootstrap-tokens-consumed.json")))

			var buf bytes.Buffer
			require.NoError(t, Write(&buf, testManifest(), files))
			out := t.TempDir()
			_, err = Extract(bytes.NewReader(buf.Bytes()), out, DefaultLimits)
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(out, "bootstrap-tokens-consumed.json"))
			require.NoError(t, err)
			assert.Equal(t, tc.after, string(got))
		})
	}
}

// TestWriteReadsTheOpenedInode: a rename over the file after Write opened
// it does not change what is archived (the handle keeps the old inode);
// shown with the handle completeLines and the copy read.
func TestWriteReadsTheOpenedInode(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "audit.jsonl", "{\"n\":1}\n{\"n\":2}\n{\"n\":", 0o600)
	src, err := openSource(filepath.Join(dir, "audit.jsonl"))
	require.NoError(t, err)
	defer src.Close()
	write(t, dir, "other", "replaced", 0o600)
	require.NoError(t, os.Rename(filepath.Join(dir, "other"), filepath.Join(dir, "audit.jsonl")))
	n, err := completeLines(src, 100)
	require.NoError(t, err)
	assert.Equal(t, int64(len("{\"n\":1}\n{\"n\":2}\n")), n)
}

func TestWriteRefusesANonRegularSource(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "f", "x", 0o600)
	files, err := Collect(dir)
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, "f")))
	require.NoError(t, os.Symlink(filepath.Join(t.TempDir(), "elsewhere"), filepath.Join(dir, "f")))
	err = Write(&bytes.Buffer{}, testManifest(), files)
	assert.Error(t, err, "a symbolic link put in place after the listing is not followed")
}

// entry is one raw tar entry for hand-made archives.
type entry struct {
	name string
	typ  byte
	mode int64
	body []byte
}

func rawArchive(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o600
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Size: int64(len(e.body)), Linkname: "/etc/passwd"}
		if typ != tar.TypeReg {
			hdr.Size = 0
		}
		require.NoError(t, tw.WriteHeader(hdr))
		if typ == tar.TypeReg {
			_, err := tw.Write(e.body)
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

func manifestEntry(t testing.TB, m Manifest) entry {
	t.Helper()
	m.Format = Format
	data, err := json.Marshal(m)
	require.NoError(t, err)
	return entry{name: manifestName, body: data}
}

func sumsEntry(t testing.TB, files ...entry) entry {
	t.Helper()
	sums := []Entry{}
	for _, f := range files {
		sum := sha256.Sum256(f.body)
		mode := f.mode
		if mode == 0 {
			mode = 0o600
		}
		sums = append(sums, Entry{Path: f.name[len(dataPrefix):], Mode: uint32(mode), Size: int64(len(f.body)), SHA256: hex.EncodeToString(sum[:])})
	}
	data, err := json.Marshal(sums)
	require.NoError(t, err)
	return entry{name: checksumsName, body: data}
}

// TestExtractRefuses: every malformed or hostile archive is refused with
// ErrInvalidArchive, and nothing is written outside the directory.
func TestExtractRefuses(t *testing.T) {
	m := manifestEntry(t, testManifest())
	good := entry{name: "data/ca/state.json", body: []byte("{}")}
	other := entry{name: "data/x", body: []byte("x")}
	tampered := sumsEntry(t, entry{name: good.name, body: []byte("{ }")})
	wrongFormat := testManifest()
	wrongFormat.Format = 2
	wf, _ := json.Marshal(wrongFormat)
	noTD := testManifest()
	noTD.TrustDomain = ""
	for _, tc := range []struct {
		name    string
		archive []byte
		want    string
	}{
		{"not gzip", []byte("PK\x03\x04 a zip file"), "not gzip"},
		{"empty", rawArchive(t), "first entry must be manifest.json"},
		{"manifest not first", rawArchive(t, good, m, sumsEntry(t, good)), "first entry must be manifest.json"},
		{"manifest with unknown fields", rawArchive(t, entry{name: manifestName, body: []byte(`{"format":1,"trust_domain":"x","extra":1}`)}), "unknown field"},
		{"manifest of another format", rawArchive(t, entry{name: manifestName, body: wf}), "format 2"},
		{"manifest without trust domain", rawArchive(t, manifestEntry(t, noTD)), "names no trust domain"},
		{"truncated: no checksums", rawArchive(t, m, good), "checksums.json is missing"},
		{"entry after checksums", rawArchive(t, m, good, sumsEntry(t, good), other), `entry "data/x" after checksums.json`},
		{"tampered file", rawArchive(t, m, good, tampered), "does not match checksums.json"},
		{"file not listed", rawArchive(t, m, good, other, sumsEntry(t, good)), "lists 1 files, the archive holds 2"},
		{"listed file missing", rawArchive(t, m, good, sumsEntry(t, good, other)), "lists 2 files, the archive holds 1"},
		{"duplicate", rawArchive(t, m, good, good, sumsEntry(t, good)), "appears twice"},
		{"outside data/", rawArchive(t, m, entry{name: "x", body: []byte("x")}), "outside data/"},
		{"parent traversal", rawArchive(t, m, entry{name: "data/../escaped", body: []byte("x")}), "not a clean relative path"},
		{"absolute", rawArchive(t, m, entry{name: "data//etc/passwd", body: []byte("x")}), "not a clean relative path"},
		{"backslash", rawArchive(t, m, entry{name: `data/..\escaped`, body: []byte("x")}), "not a clean relative path"},
		{"symlink", rawArchive(t, m, entry{name: "data/link", typ: tar.TypeSymlink}), "not a regular file"},
		{"hard link", rawArchive(t, m, entry{name: "data/link", typ: tar.TypeLink}), "not a regular file"},
		{"directory entry", rawArchive(t, m, entry{name: "data/dir/", typ: tar.TypeDir}), "not a regular file"},
		{"file over a file's directory", rawArchive(t, m, entry{name: "data/a", body: []byte("x")}, entry{name: "data/a/b", body: []byte("x")}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "staged")
			require.NoError(t, os.Mkdir(dir, 0o700))
			_, err := Extract(bytes.NewReader(tc.archive), dir, DefaultLimits)
			require.Error(t, err)
			if tc.want != "" {
				require.ErrorIs(t, err, ErrInvalidArchive)
				assert.ErrorContains(t, err, tc.want)
			}
			entries, err := os.ReadDir(parent)
			require.NoError(t, err)
			assert.Len(t, entries, 1, "nothing written next to the directory")
		})
	}
}

func TestExtractLimits(t *testing.T) {
	m := manifestEntry(t, testManifest())
	a := entry{name: "data/a", body: bytes.Repeat([]byte("a"), 1<<20)}
	b := entry{name: "data/b", body: []byte("b")}
	archive := rawArchive(t, m, a, b, sumsEntry(t, a, b))

	_, err := Extract(bytes.NewReader(archive), t.TempDir(), Limits{MaxFiles: 1, MaxBytes: 8 << 20})
	assert.ErrorContains(t, err, "more than 1 files")
	_, err = Extract(bytes.NewReader(archive), t.TempDir(), Limits{MaxFiles: 10, MaxBytes: 512 << 10})
	require.ErrorIs(t, err, ErrInvalidArchive)
	assert.ErrorContains(t, err, "inflates to more than")
	_, err = Extract(bytes.NewReader(archive), t.TempDir(), Limits{MaxFiles: 2, MaxBytes: 8 << 20})
	assert.NoError(t, err, "within both limits")
}

// TestExtractModes: group and other never get write or execute; a key is
// 0600 whatever the archive says.
func TestExtractModes(t *testing.T) {
	m := manifestEntry(t, testManifest())
	key := entry{name: "data/ca/roots/ab.key.pem", mode: 0o644, body: []byte("key")}
	wide := entry{name: "data/wide", mode: 0o777, body: []byte("x")}
	dir := t.TempDir()
	_, err := Extract(bytes.NewReader(rawArchive(t, m, key, wide, sumsEntry(t, key, wide))), dir, DefaultLimits)
	require.NoError(t, err)
	for name, want := range map[string]fs.FileMode{"ca/roots/ab.key.pem": 0o600, "wide": 0o644} {
		info, err := os.Stat(filepath.Join(dir, filepath.FromSlash(name)))
		require.NoError(t, err)
		assert.Equal(t, want, info.Mode().Perm(), name)
	}
	info, err := os.Stat(filepath.Join(dir, "ca", "roots"))
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o700), info.Mode().Perm(), "directories are private")
}

func TestExtractDetectsACorruptGzipTrailer(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, testManifest(), []File{{Path: "a", Mode: 0o600, Data: []byte("a")}}))
	data := buf.Bytes()
	data[len(data)-8] ^= 0xff // the CRC-32 of the gzip trailer
	_, err := Extract(bytes.NewReader(data), t.TempDir(), DefaultLimits)
	require.ErrorIs(t, err, ErrInvalidArchive)
}

func FuzzExtract(f *testing.F) {
	var buf bytes.Buffer
	require.NoError(f, Write(&buf, testManifest(), []File{
		{Path: "ca/state.json", Mode: 0o600, Data: []byte("{}")},
		{Path: "ca/roots/ab.key.pem", Mode: 0o600, Data: []byte("key")},
	}))
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:buf.Len()/2])
	m := manifestEntry(f, testManifest())
	f.Add(rawArchive(f, m, entry{name: "data/../x", body: []byte("x")}))
	f.Add(rawArchive(f, m, entry{name: "data/a", typ: tar.TypeSymlink}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "staged")
		require.NoError(t, os.Mkdir(dir, 0o700))
		man, err := Extract(bytes.NewReader(data), dir, Limits{MaxFiles: 50, MaxBytes: 1 << 20})
		if err == nil {
			require.NotNil(t, man)
			assert.NotEmpty(t, man.TrustDomain)
		}
		entries, rerr := os.ReadDir(parent)
		require.NoError(t, rerr)
		require.Len(t, entries, 1, "nothing written outside the directory")
		require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			assert.True(t, d.IsDir() || d.Type().IsRegular(), "%s: only files and directories", p)
			assert.Zero(t, info.Mode().Perm()&0o022, "%s: nobody else may write", p)
			return nil
		}))
	})
}
