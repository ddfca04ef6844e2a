// Package cappedfile reads small local files trustbridge is configured
// with (keys, certificates, token lists, state) without letting a wrong
// path hang or exhaust the process: only regular files, and at most a
// given size.
//
//	data, mode, err := cappedfile.ReadFile(path, 1<<20)
package fileutil

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// ErrNotRegular marks a path that is a directory, FIFO, device or socket.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge marks a file over the limit.
var ErrTooLarge = errors.New("file too large")

type tooLarge int64

func (t tooLarge) Error() string        { return fmt.Sprintf("larger than %d bytes", int64(t)) }
func (t tooLarge) Is(target error) bool { return target == ErrTooLarge }

// Read reads the regular file at path, at most limit bytes, and returns its
// mode. Symlinks are followed (Kubernetes mounts Secrets through them).
// Its own refusals ("not a regular file (p---------)", "larger than N
// bytes") carry no path, so callers can name the file their way; errors of
// the file system are *fs.PathError as usual.
func Read(path string, limit int64) ([]byte, fs.FileMode, error) {
	// Non-blocking, so that opening a FIFO does not wait for a writer; it
	// is refused below like any file that is not regular.
	f, err := os.OpenFile(path, os.O_RDONLY|openNonblock, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, notRegular(fi.Mode())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, 0, err
	}
	if int64(len(data)) > limit {
		return nil, 0, tooLarge(limit)
	}
	return data, fi.Mode(), nil
}

// ReadFile is Read with every error naming path: "PATH is not a regular
// file (...)", "PATH is larger than N bytes".
func ReadFile(path string, limit int64) ([]byte, fs.FileMode, error) {
	data, mode, err := Read(path, limit)
	if err != nil {
		var pe *fs.PathError
		if !errors.As(err, &pe) {
			err = fmt.Errorf("%s is %w", path, err)
		}
		return nil, 0, err
	}
	return data, mode, nil
}

func notRegular(m fs.FileMode) error {
	return fmt.Errorf("%w (%s)", ErrNotRegular, m.Type())
}
