package authn

import (
	"fmt"
	"os"

	"github.com/trustbridge/trustbridge/internal/datadir"
)

// lockDir takes an exclusive advisory lock on a directory, so that two
// tools rewriting a file in it one after the other do not lose a change.
// The directory itself is locked, so no lock file is left behind.
func lockDir(dir string) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	unlock, err := datadir.Wait(f, true)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return unlock, nil
}
