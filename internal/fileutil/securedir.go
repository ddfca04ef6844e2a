package fileutil

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ErrInsecure marks a directory that others could write to.
var ErrInsecureDir = errors.New("directory others can write to")

// Perm is the mode of directories Ensure creates.
const DirPerm = 0o700

// Ensure creates path (and missing parents) with mode 0700 when missing,
// then checks it.
func EnsureDir(path string) error {
	if err := os.MkdirAll(path, DirPerm); err != nil {
		return err
	}
	return CheckDir(path)
}

// Check refuses path unless it is a directory, neither group- nor
// other-writable, owned by the effective user or root. Symlinks are
// followed: the directory written to is what counts. The error says which
// command fixes it.
func CheckDir(path string) error {
	return check(path, os.Geteuid())
}

func check(path string, euid int) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%s is not a directory (%s)", path, info.Mode())
	}
	if perm := info.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by %s (%s), so another user could plant files trustbridge trusts; fix: chmod go-w %s",
			ErrInsecureDir, path, whoWrites(perm), info.Mode(), path)
	}
	if owner, ok := dirOwner(info); ok && euid >= 0 && owner != euid && owner != 0 {
		return fmt.Errorf("%w: %s is owned by uid %d, not by uid %d that trustbridge runs as (nor root), so that user could change it; fix: chown %d %s, or run trustbridge as uid %d",
			ErrInsecureDir, path, owner, euid, euid, path, owner)
	}
	return nil
}

func whoWrites(perm fs.FileMode) string {
	switch {
	case perm&0o020 != 0 && perm&0o002 != 0:
		return "its group and others"
	case perm&0o020 != 0:
		return "its group"
	default:
		return "others"
	}
}
