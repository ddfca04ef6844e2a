//go:build unix

package authn

import (
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive advisory lock on a directory, so that two
// tools rewriting a file in it one after the other do not lose a change.
// The directory itself is locked, so no lock file is left behind.
func lockDir(dir string) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}
