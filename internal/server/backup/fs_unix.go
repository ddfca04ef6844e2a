//go:build unix

package backup

import (
	"os"
	"path/filepath"
	"syscall"
)

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
