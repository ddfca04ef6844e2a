package backup

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Format is the archive format this package writes and reads.
const Format = 1

const (
	manifestName  = "manifest.json"
	checksumsName = "checksums.json"
	dataPrefix    = "data/"
	// maxMetaSize bounds manifest.json and checksums.json.
	maxMetaSize = 4 << 20
)

// ErrInvalidArchive marks an archive Extract refuses.
var ErrInvalidArchive = errors.New("invalid backup archive")

// Manifest describes an archive.
type Manifest struct {
	Format      int       `json:"format"`
	TrustDomain string    `json:"trust_domain"`
	Created     time.Time `json:"created"`
	// Sequence is the spiffe_sequence of the state in the archive. A
	// server started on the restored state publishes a higher one.
	Sequence uint64 `json:"sequence"`
	// Version is the trustbridge version that wrote the archive.
	Version string `json:"trustbridge_version,omitempty"`
}

// Entry is one file in checksums.json.
type Entry struct {
	Path   string `json:"path"`
	Mode   uint32 `json:"mode"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// File is one file to archive, named relative to the data directory with
// forward slashes: Data with Mode when Data is not nil, otherwise the file
// Source.
type File struct {
	Path string
	Mode fs.FileMode
	Data []byte
	// Source is read through one open handle: its size and mode are the
	// open inode's (fstat), so a rename over Source after it is opened
	// changes nothing, and one before is archived whole, as the new file.
	Source string
	// Log marks an append-only log: its copy stops after the last
	// complete line, so a line being appended is left out whole.
	Log bool
}

// Write writes the archive of files to w: the manifest, the files, their
// checksums. It fails if a Source file is not a regular file when opened,
// or shrinks while it is copied (truncated in place: trustbridge never
// does that).
func Write(w io.Writer, m Manifest, files []File) error {
	m.Format = Format
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	meta, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := writeEntry(tw, manifestName, 0o600, int64(len(meta)), bytes.NewReader(meta), m.Created); err != nil {
		return err
	}
	sums := make([]Entry, 0, len(files))
	for _, f := range files {
		e, err := writeFile(tw, f, m.Created)
		if err != nil {
			return err
		}
		sums = append(sums, e)
	}
	meta, err = json.MarshalIndent(sums, "", "  ")
	if err != nil {
		return err
	}
	if err := writeEntry(tw, checksumsName, 0o600, int64(len(meta)), bytes.NewReader(meta), m.Created); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func writeFile(tw *tar.Writer, f File, at time.Time) (Entry, error) {
	if err := checkPath(f.Path); err != nil {
		return Entry{}, err
	}
	var (
		r    io.Reader
		size int64
		mode = f.Mode.Perm()
	)
	if f.Data != nil {
		r, size = bytes.NewReader(f.Data), int64(len(f.Data))
	} else {
		src, err := openSource(f.Source)
		if err != nil {
			return Entry{}, fmt.Errorf("%s: %w", f.Path, err)
		}
		defer src.Close()
		// Size and mode of the inode this handle reads, not of whatever
		// the path names by now.
		info, err := src.Stat()
		if err != nil {
			return Entry{}, fmt.Errorf("%s: %w", f.Path, err)
		}
		if !info.Mode().IsRegular() {
			return Entry{}, fmt.Errorf("%s is not a regular file (%s); trustbridge writes none, move it out of the data directory", f.Source, info.Mode().Type())
		}
		size, mode = info.Size(), info.Mode().Perm()
		if f.Log {
			if size, err = completeLines(src, size); err != nil {
				return Entry{}, fmt.Errorf("%s: %w", f.Path, err)
			}
		}
		r = io.NewSectionReader(src, 0, size)
	}
	h := sha256.New()
	if err := writeEntry(tw, dataPrefix+f.Path, mode, size, io.TeeReader(r, h), at); err != nil {
		return Entry{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	return Entry{Path: f.Path, Mode: uint32(mode), Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

func writeEntry(tw *tar.Writer, name string, mode fs.FileMode, size int64, r io.Reader, at time.Time) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(mode), Size: size, ModTime: at, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, r)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("read %d bytes, want %d (the file shrank while it was copied)", n, size)
	}
	return nil
}

// checkPath accepts a clean, relative, slash-separated path without "."
// or ".." elements or backslashes.
func checkPath(p string) error {
	if !fs.ValidPath(p) || p == "." || strings.ContainsAny(p, `\`+"\x00") {
		return fmt.Errorf("%w: file name %q is not a clean relative path", ErrInvalidArchive, p)
	}
	return nil
}

// Limits bound what Extract accepts.
type Limits struct {
	MaxFiles int
	// MaxBytes bounds the inflated size of the whole archive.
	MaxBytes int64
}

// DefaultLimits fit a data directory with a long audit log many times over.
var DefaultLimits = Limits{MaxFiles: 100_000, MaxBytes: 8 << 30}

// Extract reads an archive from r into dir, an existing empty directory,
// and checks it: manifest first, files under data/ with clean names, each
// once, checksums last, and every file's size, mode and SHA-256 as
// checksums.json lists them, no more and no fewer. Files are written with
// their archived mode, without group or other write and without execute;
// a file whose name says it holds a key ("key" in its last element) is
// 0600 whatever the archive says. On error dir may hold part of the
// archive: the caller removes it.
func Extract(r io.Reader, dir string, lim Limits) (*Manifest, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("%w: not gzip: %v", ErrInvalidArchive, err)
	}
	budget := &io.LimitedReader{R: gz, N: lim.MaxBytes + 1}
	x := &extractor{dir: dir, lim: lim, tr: tar.NewReader(budget), seen: map[string]Entry{}}
	m, err := x.run()
	if budget.N <= 0 {
		return nil, fmt.Errorf("%w: inflates to more than %d bytes", ErrInvalidArchive, lim.MaxBytes)
	}
	if err != nil {
		return nil, err
	}
	// The gzip trailer's checksum is verified only when the stream is read
	// to its end.
	if _, err := io.Copy(io.Discard, budget); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArchive, err)
	}
	if budget.N <= 0 {
		return nil, fmt.Errorf("%w: inflates to more than %d bytes", ErrInvalidArchive, lim.MaxBytes)
	}
	return m, nil
}

type extractor struct {
	dir  string
	lim  Limits
	tr   *tar.Reader
	seen map[string]Entry
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArchive}, a...)...)
}

// run reads the archive in its order: the manifest, the data files up to
// checksums.json, then nothing more.
func (x *extractor) run() (*Manifest, error) {
	m, err := x.manifest()
	if err != nil {
		return nil, err
	}
	if err := x.files(); err != nil {
		return nil, err
	}
	if err := x.end(); err != nil {
		return nil, err
	}
	return m, nil
}

// manifest reads and checks the first entry, which must be the manifest.
func (x *extractor) manifest() (*Manifest, error) {
	hdr, err := x.next()
	if err != nil {
		return nil, err
	}
	if hdr == nil || hdr.Name != manifestName {
		return nil, invalid("the first entry must be %s", manifestName)
	}
	var m Manifest
	if err := x.decodeMeta(hdr, &m); err != nil {
		return nil, err
	}
	if m.Format != Format {
		return nil, invalid("format %d; this trustbridge reads format %d", m.Format, Format)
	}
	if m.TrustDomain == "" {
		return nil, invalid("%s names no trust domain", manifestName)
	}
	return &m, nil
}

// files writes the data entries until checksums.json, which it checks
// against them.
func (x *extractor) files() error {
	for {
		hdr, err := x.next()
		if err != nil {
			return err
		}
		if hdr == nil {
			return invalid("%s is missing (a truncated archive?)", checksumsName)
		}
		if hdr.Name == checksumsName {
			return x.checkSums(hdr)
		}
		if err := x.file(hdr); err != nil {
			return err
		}
	}
}

// end refuses any entry after checksums.json.
func (x *extractor) end() error {
	hdr, err := x.next()
	if err != nil {
		return err
	}
	if hdr != nil {
		return invalid("entry %q after %s", hdr.Name, checksumsName)
	}
	return nil
}

// next returns the next entry, nil at the end.
func (x *extractor) next() (*tar.Header, error) {
	hdr, err := x.tr.Next()
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	if err != nil {
		return nil, invalid("%v", err)
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil, invalid("entry %q is not a regular file (type %q)", hdr.Name, hdr.Typeflag)
	}
	if hdr.Size < 0 {
		return nil, invalid("entry %q has a negative size", hdr.Name)
	}
	return hdr, nil
}

func (x *extractor) decodeMeta(hdr *tar.Header, v any) error {
	if hdr.Size > maxMetaSize {
		return invalid("%s is larger than %d bytes", hdr.Name, maxMetaSize)
	}
	data, err := io.ReadAll(io.LimitReader(x.tr, maxMetaSize))
	if err != nil {
		return invalid("%s: %v", hdr.Name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("%s does not parse: %v", hdr.Name, err)
	}
	if dec.More() {
		return invalid("%s has data after its value", hdr.Name)
	}
	return nil
}

// file writes one data/ entry under dir.
func (x *extractor) file(hdr *tar.Header) error {
	rel, ok := strings.CutPrefix(hdr.Name, dataPrefix)
	if !ok {
		return invalid("entry %q is outside %s", hdr.Name, dataPrefix)
	}
	if err := checkPath(rel); err != nil {
		return err
	}
	if _, dup := x.seen[rel]; dup {
		return invalid("%q appears twice", rel)
	}
	if len(x.seen) >= x.lim.MaxFiles {
		return invalid("more than %d files", x.lim.MaxFiles)
	}
	mode := restoredMode(rel, fs.FileMode(hdr.Mode))
	p := filepath.Join(x.dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return invalid("%q: %v", rel, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), x.tr)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return invalid("%q: %v", rel, err)
	}
	// The umask may have narrowed the mode; the archive's, narrowed by
	// restoredMode, is what the data directory held.
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	x.seen[rel] = Entry{Path: rel, Mode: uint32(fs.FileMode(hdr.Mode).Perm()), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}
	return nil
}

// restoredMode never grants group or other write, or execute; key files
// are 0600.
func restoredMode(rel string, archived fs.FileMode) fs.FileMode {
	if strings.Contains(path.Base(rel), "key") {
		return 0o600
	}
	return archived.Perm() & 0o644
}

// checkSums reads checksums.json and compares it with what was written.
func (x *extractor) checkSums(hdr *tar.Header) error {
	var sums []Entry
	if err := x.decodeMeta(hdr, &sums); err != nil {
		return err
	}
	if len(sums) != len(x.seen) {
		return invalid("%s lists %d files, the archive holds %d", checksumsName, len(sums), len(x.seen))
	}
	for _, want := range sums {
		got, ok := x.seen[want.Path]
		if !ok {
			return invalid("%s lists %q, which the archive does not hold", checksumsName, want.Path)
		}
		if got != want {
			return invalid("%q does not match %s (size %d, sha256 %s; listed size %d, sha256 %s)",
				want.Path, checksumsName, got.Size, got.SHA256, want.Size, want.SHA256)
		}
	}
	return nil
}
