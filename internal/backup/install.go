package backup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// ErrTargetNotEmpty: Install refuses to put a restore over data.
var ErrTargetNotEmpty = errors.New("target directory is not empty")

// Install moves staged, a directory Extract filled and the caller
// checked, to target. staged must be in target's parent directory, so the
// move is one rename. A missing or empty target is replaced. A non-empty
// one is refused unless force; with force it is first moved aside to
// <target>.replaced-<UTC time>, whose path Install returns: nothing is
// deleted. A target some process holds a lock file in (a running server)
// is refused even with force.
func Install(staged, target string, force bool, now time.Time) (replaced string, err error) {
	info, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", os.Rename(staged, target)
	case err != nil:
		return "", err
	case !info.IsDir():
		return "", fmt.Errorf("restore: %s exists and is not a directory", target)
	}
	entries, err := os.ReadDir(target)
	if err != nil {
		return "", err
	}
	if len(entries) == 0 {
		if err := os.Remove(target); err != nil {
			return "", err
		}
		return "", os.Rename(staged, target)
	}
	if !force {
		return "", fmt.Errorf("restore: %w: %s holds %d entries; restore into a new or empty directory, or pass --force to move %s aside (to %s.replaced-<time>) first",
			ErrTargetNotEmpty, target, len(entries), target, target)
	}
	if err := Busy(target); err != nil {
		return "", err
	}
	replaced = target + ".replaced-" + now.UTC().Format("20060102T150405Z")
	if _, err := os.Lstat(replaced); err == nil {
		return "", fmt.Errorf("restore: %s already exists; try again in a second", replaced)
	}
	if err := os.Rename(target, replaced); err != nil {
		return "", err
	}
	if err := os.Rename(staged, target); err != nil {
		if rerr := os.Rename(replaced, target); rerr != nil {
			return "", fmt.Errorf("restore: %w; and moving %s back to %s failed: %v", err, replaced, target, rerr)
		}
		return "", err
	}
	return replaced, nil
}

// lockFiles lists the lock files of a data directory: at its top and one
// level down (ca/.lock).
func lockFiles(dir string) []string {
	var out []string
	for _, pattern := range []string{"*.lock", ".lock", filepath.Join("*", "*.lock"), filepath.Join("*", ".lock")} {
		matches, _ := filepath.Glob(filepath.Join(dir, pattern))
		out = append(out, matches...)
	}
	return out
}
