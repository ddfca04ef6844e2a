package backup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/trustbridge/trustbridge/internal/datadir"
	"github.com/trustbridge/trustbridge/internal/fileutil"
)

var (
	// ErrTargetNotEmpty: a restore is refused over data without force.
	ErrTargetNotEmpty = errors.New("target directory is not empty")
	// ErrHalfway marks an Install that failed after moving some entries
	// and could not undo every move: the error says what is where, and
	// the staging directory must be kept.
	ErrHalfway = errors.New("restore stopped half way")
)

// lostFound is a file system's own directory at the root of a volume; a
// server ignores it, so a restore leaves it where it is.
const lostFound = "lost+found"

// ErrBusy: a process holds a lock in the data directory.
var ErrBusy = errors.New("data directory in use")

// busy reports whether a process holds a lock file in dir other than the
// data directory lock (OpenTarget holds that one): `ca issue` or `ca
// rotate` writing the CA state. It tries each lock without waiting
// (datadir.LockFile); closing the file releases it at once. Where flock
// is unavailable it cannot tell: stop the server before a restore.
func busy(dir string) error {
	for _, p := range lockFiles(dir) {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		err = datadir.LockFile(f)
		f.Close()
		if errors.Is(err, datadir.ErrHeld) {
			return fmt.Errorf("restore: %w: a running process holds %s; stop the trustbridge server (and any ca command) using %s first", ErrBusy, p, dir)
		}
	}
	return nil
}

// TargetOptions say how OpenTarget treats the data directory.
type TargetOptions struct {
	// Force allows a restore over a non-empty directory, whose contents
	// are moved aside first.
	Force bool
	// Commit names the entry moved aside first and into place last (the
	// CA state directory), so that a target left half way never holds a
	// complete-looking mix of old and restored state.
	Commit string
	// Command is what the lock record names, e.g. "trustbridge restore".
	Command string

	// inPlace takes the path a mount point needs, whatever the target is.
	inPlace bool
	// rename replaces os.Rename, to inject failures.
	rename func(oldpath, newpath string) error
}

// Target is a data directory being restored, locked (datadir.Acquire)
// from OpenTarget to Release, so no server starts on it in between.
type Target struct {
	dir     string
	o       TargetOptions
	exists  bool
	inPlace bool
	lock    *datadir.Lock
}

// OpenTarget checks dir as a restore target and, if it exists, takes its
// data directory lock until Release. It refuses a path that is not a
// directory, a directory a server (or a ca command) holds, and a
// non-empty one unless o.Force. The lock file and lost+found do not make
// a directory non-empty. A missing dir is locked by Install through the
// staging directory that becomes it.
//
// A directory that is a mount point (another device than its parent, or
// holding lost+found) cannot be renamed: its entries are moved instead
// (see Install).
func OpenTarget(dir string, o TargetOptions) (*Target, error) {
	if o.rename == nil {
		o.rename = os.Rename
	}
	t := &Target{dir: dir, o: o}
	info, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return t, nil
	case err != nil:
		return nil, fmt.Errorf("restore: %w", err)
	case !info.IsDir():
		return nil, fmt.Errorf("restore: %s exists and is not a directory", dir)
	}
	t.exists = true
	t.lock, err = datadir.Acquire(dir, datadir.Self(o.Command))
	if err != nil {
		if errors.Is(err, datadir.ErrHeld) {
			return nil, fmt.Errorf("restore: %w: %w", ErrBusy, err)
		}
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := t.check(); err != nil {
		_ = t.Release()
		return nil, err
	}
	return t, nil
}

func (t *Target) check() error {
	if err := busy(t.dir); err != nil {
		return err
	}
	old, err := t.entries(t.dir, "")
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if len(old) > 0 && !t.o.Force {
		return fmt.Errorf("restore: %w: %s holds %d entries; restore into a new or empty directory, or pass --force to move them aside (to %s.replaced-<time>) first",
			ErrTargetNotEmpty, t.dir, len(old), t.dir)
	}
	_, err = os.Lstat(filepath.Join(t.dir, lostFound))
	t.inPlace = t.o.inPlace || err == nil || mountPoint(t.dir)
	return nil
}

// Release releases the target's lock.
func (t *Target) Release() error {
	if t == nil || t.lock == nil {
		return nil
	}
	err := t.lock.Release()
	t.lock = nil
	return err
}

// StageDir makes the directory to extract the archive into: beside a
// missing target, inside an existing one (on its file system, so that
// its entries move into place by rename even on a mount point).
func (t *Target) StageDir() (string, error) {
	if !t.exists {
		d, err := os.MkdirTemp(filepath.Dir(t.dir), "."+filepath.Base(t.dir)+".restore-")
		if err != nil {
			return "", fmt.Errorf("restore: %w (the parent of the data directory must exist)", err)
		}
		return d, nil
	}
	d, err := os.MkdirTemp(t.dir, ".restore-")
	if err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	return d, nil
}

// Install puts staged, a directory Extract filled and the caller checked,
// in place of the target, and returns where the target's old contents
// went ("" if it had none). Nothing is deleted.
//
//   - A missing target: staged is renamed to it.
//   - An empty one (but for lost+found and the lock file): staged's
//     entries are moved into it.
//   - A non-empty one: renamed aside to <dir>.replaced-<UTC time> and
//     staged renamed to <dir>; a mount point, which cannot be renamed,
//     keeps its place: its entries move into <dir>/replaced-<UTC time>
//     (lost+found and the lock file stay), then staged's entries move
//     in. If a move fails, the moves made are undone; if undoing fails
//     too, the error wraps ErrHalfway and says what is where.
//
// Every directory renamed in or out of is synced.
func (t *Target) Install(staged string, now time.Time) (replaced string, err error) {
	stamp := now.UTC().Format("20060102T150405Z")
	if !t.exists {
		return "", t.renameWhole(staged, "", "")
	}
	old, err := t.entries(t.dir, staged)
	if err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	if len(old) == 0 {
		return "", t.moveEntries(staged, "", nil)
	}
	if !t.o.Force {
		return "", fmt.Errorf("restore: %w: %s holds %d entries", ErrTargetNotEmpty, t.dir, len(old))
	}
	if !t.inPlace {
		replaced = t.dir + ".replaced-" + stamp
		if _, err := os.Lstat(replaced); err == nil {
			return "", fmt.Errorf("restore: %s already exists; try again in a second", replaced)
		}
		err := t.renameWhole(staged, replaced, stamp)
		if !errors.Is(err, syscall.EBUSY) {
			if err != nil {
				return "", err
			}
			return replaced, nil
		}
		// A mount point not seen as one: move its entries instead.
	}
	replaced = filepath.Join(t.dir, "replaced-"+stamp)
	if err := os.Mkdir(replaced, 0o700); err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	if err := t.moveEntries(staged, replaced, old); err != nil {
		return "", err
	}
	return replaced, nil
}

// renameWhole renames staged to the target, first renaming an existing
// target to replaced. staged's own lock is held meanwhile: a server that
// starts while the target path is missing or new finds it held.
func (t *Target) renameWhole(staged, replaced, stamp string) error {
	lock, err := datadir.Acquire(staged, datadir.Self(t.o.Command))
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer lock.Release()
	src := staged
	if replaced != "" {
		if err := t.o.rename(t.dir, replaced); err != nil {
			_ = lock.Release()
			// The lock file would otherwise be moved in as an entry.
			_ = os.Remove(filepath.Join(staged, datadir.LockName))
			return fmt.Errorf("restore: moving %s aside: %w", t.dir, err)
		}
		if rel, ok := Inside(t.dir, staged); ok {
			src = filepath.Join(replaced, rel)
		}
	}
	if err := t.o.rename(src, t.dir); err != nil {
		if replaced == "" {
			if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
				return fmt.Errorf("restore: %s appeared while the archive was checked (a server started with --init?); nothing was moved: %w", t.dir, err)
			}
			return fmt.Errorf("restore: %w", err)
		}
		if rerr := t.o.rename(replaced, t.dir); rerr != nil {
			return fmt.Errorf("restore: %w: putting the restored state at %s failed (%v), and moving the previous contents back from %s failed too (%v); "+
				"the previous contents are in %s, the checked restored state in %s: move the one you want to %s",
				ErrHalfway, t.dir, err, replaced, rerr, replaced, src, t.dir)
		}
		return fmt.Errorf("restore: putting the restored state at %s: %w; %s is as it was", t.dir, err, t.dir)
	}
	if err := fileutil.SyncDir(filepath.Dir(t.dir)); err != nil {
		return fmt.Errorf("restore: restored %s, but syncing its parent directory failed: %w", t.dir, err)
	}
	return nil
}

// moveEntries moves the target's old entries into replaced (the Commit
// entry first), then staged's entries into the target (the Commit entry
// last), and removes the emptied staged. A failed move undoes the moves
// made; if that fails too the error wraps ErrHalfway and lists where
// every entry is.
func (t *Target) moveEntries(staged, replaced string, old []string) error {
	t.commitFirst(old, true)
	restored, err := t.entries(staged, "")
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	t.commitFirst(restored, false)

	m := &mover{t: t, staged: staged, replaced: replaced}
	for _, name := range old {
		if err := m.move(filepath.Join(t.dir, name), filepath.Join(replaced, name), "aside"); err != nil {
			return err
		}
	}
	for _, name := range restored {
		if err := m.move(filepath.Join(staged, name), filepath.Join(t.dir, name), "into place"); err != nil {
			return err
		}
	}
	if err := os.Remove(staged); err != nil {
		return fmt.Errorf("restore: restored %s, but removing the emptied %s failed: %w", t.dir, staged, err)
	}
	dirs := []string{t.dir, filepath.Dir(staged)}
	if replaced != "" {
		dirs = append(dirs, replaced)
	}
	for _, d := range dirs {
		if err := fileutil.SyncDir(d); err != nil {
			return fmt.Errorf("restore: restored %s, but syncing %s failed: %w", t.dir, d, err)
		}
	}
	return nil
}

// commitFirst sorts names so that the commit entry (the CA state) comes
// first (first) or last, the order of the others kept.
func (t *Target) commitFirst(names []string, first bool) {
	slices.SortStableFunc(names, func(a, b string) int {
		ca, cb := a == t.o.Commit, b == t.o.Commit
		switch {
		case ca == cb:
			return 0
		case ca == first:
			return -1
		default:
			return 1
		}
	})
}

// mover renames a restore's entries one by one and, when one fails, moves
// back every entry it moved, newest first.
type mover struct {
	t                *Target
	staged, replaced string
	done             [][2]string // from, to
}

func (m *mover) move(from, to, where string) error {
	if err := m.t.o.rename(from, to); err != nil {
		return m.fail("moving "+from+" "+where, err)
	}
	m.done = append(m.done, [2]string{from, to})
	return nil
}

func (m *mover) fail(what string, err error) error {
	t := m.t
	var undoErrs []error
	for i := len(m.done) - 1; i >= 0; i-- {
		if uerr := t.o.rename(m.done[i][1], m.done[i][0]); uerr != nil {
			undoErrs = append(undoErrs, uerr)
		}
	}
	if len(undoErrs) == 0 {
		if m.replaced != "" {
			_ = os.Remove(m.replaced)
		}
		return fmt.Errorf("restore: %s: %w; every entry was moved back: %s is as it was", what, err, t.dir)
	}
	return fmt.Errorf("restore: %w: %s: %v; moving back failed too (%v). Now %s; "+
		"to go back, move the entries of %s into %s and the restored ones back; to finish the restore, move the old entries out of %s and the entries of %s in; nothing was deleted",
		ErrHalfway, what, err, errors.Join(undoErrs...), t.where(m.staged, m.replaced), m.replaced, t.dir, t.dir, m.staged)
}

// where says which entries each directory holds, for an error message.
func (t *Target) where(staged, replaced string) string {
	var parts []string
	for _, d := range []struct{ dir, what string }{{t.dir, "the data directory"}, {replaced, "the moved-aside directory"}, {staged, "the staging directory"}} {
		if d.dir == "" {
			continue
		}
		names, err := t.entries(d.dir, staged)
		switch {
		case err != nil:
			parts = append(parts, fmt.Sprintf("%s %s cannot be read (%v)", d.what, d.dir, err))
		case len(names) == 0:
			parts = append(parts, fmt.Sprintf("%s %s holds nothing", d.what, d.dir))
		default:
			parts = append(parts, fmt.Sprintf("%s %s holds %s", d.what, d.dir, strings.Join(names, ", ")))
		}
	}
	return strings.Join(parts, "; ")
}

// entries lists dir's entries but for lost+found, the data directory lock
// file, the staging directory skip and moved-aside directories of
// earlier in-place restores.
func (t *Target) entries(dir, skip string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, de := range des {
		name := de.Name()
		if name == lostFound || name == datadir.LockName || filepath.Join(dir, name) == skip {
			continue
		}
		names = append(names, name)
	}
	return names, nil
}

// Inside says whether p is inside dir (dir itself is not), and where.
func Inside(dir, p string) (string, bool) {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", false
	}
	return rel, true
}

// lockFiles lists the lock files of a data directory other than the data
// directory lock, which OpenTarget holds: at its top and one level down
// (ca/.lock).
func lockFiles(dir string) []string {
	var out []string
	for _, pattern := range []string{"*.lock", ".lock", filepath.Join("*", "*.lock"), filepath.Join("*", ".lock")} {
		matches, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, m := range matches {
			if m != filepath.Join(dir, datadir.LockName) {
				out = append(out, m)
			}
		}
	}
	return out
}
