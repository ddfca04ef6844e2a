// Package atomicfile writes files so that readers and crashes see either
// the old content or the new, never a mix: key material and CA state must
// never be half-written.
package fileutil

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Write writes data to path so that readers see the old or the new
// content, never a mix, even across a crash: temp file in the same
// directory, fsync, rename, fsync the directory.
func Write(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, nil)
}

// WriteNew is Write for a file that must not exist yet: fill writes the
// content (mode perm) into a temporary file beside path, synced, which is
// then linked to path, so path never holds half a file and a file created
// there meanwhile is never replaced: the error is then fs.ErrExist.
func WriteNew(path string, perm os.FileMode, fill func(io.Writer) error) error {
	return create(path, perm, nil, fill, false)
}

// Replace is Write for a file that another account may own: an operator
// running a tool as root on a file a service reads. The new file gets the
// owner (and, where allowed, the group) of the file it replaces, so the
// service can still read it; when the owner cannot be kept, nothing is
// written and the error says so. Its mode is perm narrowed to the
// replaced file's, never wider than either, except that a file of the
// writer's own whose group is another (0640 root:trustbridge: the service
// reads it through its group) keeps its group bits. A missing file is
// created as Write does.
func Replace(path string, data []byte, perm os.FileMode) error {
	info, err := os.Stat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err != nil {
		return write(path, data, perm, nil)
	}
	uid, gid, ok := ownerOf(info)
	perm = replacedMode(info.Mode(), perm, ok && uid == os.Geteuid() && gid != os.Getegid())
	if !ok || uid == os.Geteuid() && gid == os.Getegid() {
		return write(path, data, perm, nil)
	}
	return write(path, data, perm, func(f *os.File) error {
		if uid == os.Geteuid() {
			// The owner reads it whatever the group; keep the group
			// where the writer may.
			_ = f.Chown(-1, gid)
			return nil
		}
		if err := f.Chown(uid, gid); err != nil {
			return fmt.Errorf("%s belongs to uid %d and its replacement could not be given to that user (%w); run as that user or as root", path, uid, err)
		}
		return nil
	})
}

// replacedMode is the mode of a replacement for a file of mode old: the
// bits both grant, and old's group bits when the group is the way its
// reader gets in (keepGroup).
func replacedMode(old, perm os.FileMode, keepGroup bool) os.FileMode {
	if keepGroup {
		perm |= 0o070
	}
	return old.Perm() & perm.Perm()
}

// IsTemp says whether name (a base name) is one of the temporary files
// Write creates beside its target and renames or removes before it
// returns: one left by a crash holds nothing anyone committed.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempInfix)
}

// tempInfix marks Write's temporary files: "."+base+tempInfix+random.
const tempInfix = ".tmp-"

// write is Write with prepare, when not nil, called on the temporary file
// before anything is written to it.
func write(path string, data []byte, perm os.FileMode, prepare func(*os.File) error) error {
	return create(path, perm, prepare, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}, true)
}

// create writes path through a temporary file beside it: prepare (may be
// nil), then fill, sync, and then a rename over path (replace) or a link
// that fails if path exists, and a sync of the directory.
func create(path string, perm os.FileMode, prepare func(*os.File) error, fill func(io.Writer) error, replace bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+tempInfix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if tmp != "" {
			_ = os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file 0600; chmod before any secret is written
	// only ever narrows it.
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if prepare != nil {
		if err := prepare(f); err != nil {
			f.Close()
			return err
		}
	}
	if err := fill(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if replace {
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
		tmp = ""
	} else if err := os.Link(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}
