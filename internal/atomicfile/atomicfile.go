// Package atomicfile writes files so that readers and crashes see either
// the old content or the new, never a mix: key material and CA state must
// never be half-written.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path so that readers see the old or the new
// content, never a mix, even across a crash: temp file in the same
// directory, fsync, rename, fsync the directory.
func Write(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
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
	if _, err := f.Write(data); err != nil {
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
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	tmp = ""
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
