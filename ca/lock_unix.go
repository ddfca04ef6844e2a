//go:build unix

package ca

import (
	"fmt"
	"os"

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
	f, err := os.OpenFile(s.lockPath(), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, s.wrap(err)
	}
	unlock, err := datadir.Wait(f, exclusive)
	if err != nil {
		return nil, s.wrap(fmt.Errorf("lock: %w", err))
	}
	return unlock, nil
}
