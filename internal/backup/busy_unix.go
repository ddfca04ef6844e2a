//go:build unix

package backup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrBusy: a process holds a lock in the data directory.
var ErrBusy = errors.New("data directory in use")

// Busy reports whether a process holds a lock file in dir other than the
// data directory lock (OpenTarget holds that one): `ca issue` or `ca
// rotate` writing the CA state. It only tries each lock, without waiting,
// and releases it at once.
func Busy(dir string) error {
	for _, p := range lockFiles(dir) {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("restore: %w: a running process holds %s; stop the trustbridge server (and any ca command) using %s first", ErrBusy, p, dir)
		}
	}
	return nil
}

// openSource opens a file to archive without following a symbolic link
// put in its place since it was listed.
func openSource(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
}

// mountPoint says whether dir is on another device than its parent: a
// mount point, which rename cannot move.
func mountPoint(dir string) bool {
	var st, parent syscall.Stat_t
	if syscall.Stat(dir, &st) != nil || syscall.Stat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// syncDir makes the renames in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
