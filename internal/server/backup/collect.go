package backup

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// Collect lists the files of dataDir to archive as they are on disk:
// every regular file except those under the top-level names in skip (the
// caller archives them itself, from a consistent read), lock files (they
// name a process of this machine, not state), unix sockets (the same)
// and the temporary files of
// an interrupted atomic write. It takes no sizes: Write archives each file
// as the inode it opens holds it, so a file replaced by rename between
// the listing and the copy is archived whole, as the new file. An
// append-only log (*.jsonl) is marked Log: its copy stops after its last
// complete line. A symbolic link or any other
// non-regular file is refused: trustbridge writes none, and following one
// could archive a file from outside the directory.
func Collect(dataDir string, skip ...string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dataDir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if top, _, _ := strings.Cut(rel, "/"); contains(skip, top) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case d.IsDir():
			return nil
		case d.Type()&fs.ModeSocket != 0:
			// A listening server's socket (--admin-socket may be in the
			// data directory): a process of this machine, not state.
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("backup: %s is not a regular file (%s); trustbridge writes none, move it out of the data directory", p, d.Type())
		case skipFile(path.Base(rel)):
			return nil
		}
		files = append(files, File{Path: rel, Source: p, Log: strings.HasSuffix(rel, ".jsonl")})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return files, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// skipFile: lock files, and the temporary files of internal/fileutil
// (".<name>.tmp-<random>").
func skipFile(name string) bool {
	return name == ".lock" || strings.HasSuffix(name, ".lock") || fileutil.IsTemp(name)
}

// completeLines is the length of the first size bytes of r up to and
// including the last newline.
func completeLines(r io.ReaderAt, size int64) (int64, error) {
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	for end := size; end > 0; {
		start := max(end-chunk, 0)
		n, err := r.ReadAt(buf[:end-start], start)
		if err != nil && err != io.EOF {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return start + int64(i) + 1, nil
		}
		end = start
	}
	return 0, nil
}
