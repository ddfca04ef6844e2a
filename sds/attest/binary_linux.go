package attest

import (
	"os"
	"syscall"
)

// keyOf is st's fileKey; false when the file system says nothing of it.
func keyOf(st os.FileInfo) (fileKey, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileKey{}, false
	}
	return fileKey{dev: uint64(sys.Dev), ino: sys.Ino, size: sys.Size, mtime: sys.Mtim.Nano(), ctime: sys.Ctim.Nano()}, true
}

// idOf is the file st names, by device and inode.
func idOf(st os.FileInfo) (fileID, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(sys.Dev), ino: sys.Ino}, true
}
