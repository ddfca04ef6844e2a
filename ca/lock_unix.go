//go:build unix

package ca

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/trustbridge/trustbridge/internal/datadir"
)

// Lock takes an advisory lock on the state directory: exclusive for
// writers (the server's rotation, `ca rotate`), shared for readers
// (`ca issue`), so a reader never sees a root named by the journal whose
// files a writer is about to remove. The returned func releases it.
func (s *Store) Lock(exclusive bool) (func(), error) {
	if exclusive {
		if err := s.ensureDirs(); err != nil {
			return nil, s.wrap(err)
		}
	} else if _, err := os.Stat(s.dir); err != nil {
		// A reader must not create a state directory where there is none
		// (a mistyped --data-dir).
		return nil, s.wrap(fmt.Errorf("no CA state: %w", err))
	}
	f, err := openLock(s.lockPath(), exclusive)
	if !exclusive && errors.Is(err, syscall.EROFS) {
		// A read-only file system (a snapshot, a read-only mount): no
		// writer can change the state under a reader.
		return func() {}, nil
	}
	if err != nil {
		return nil, s.wrap(err)
	}
	unlock, err := datadir.Wait(f, exclusive)
	if err != nil {
		return nil, s.wrap(fmt.Errorf("lock: %w", err))
	}
	return unlock, nil
}

// openLock opens the lock file. A shared lock needs no write access, so a
// reader opens an existing one read-only: `trustbridge backup` reads a
// data directory it may not write to. A writer creates it, and so does a
// reader that finds none.
func openLock(path string, exclusive bool) (*os.File, error) {
	if !exclusive {
		f, err := os.Open(path)
		if !errors.Is(err, fs.ErrNotExist) {
			return f, err
		}
	}
	return os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
}
