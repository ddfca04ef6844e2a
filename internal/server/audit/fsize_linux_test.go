//go:build linux

package audit

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fsizeChildEnv = "TRUSTBRIDGE_AUDIT_FSIZE_CHILD"

// A real short write: the file size limit (RLIMIT_FSIZE, what a full disk
// or a quota looks like to write(2)) lets the kernel put down part of the
// entry and then fail with EFBIG. The limit is process-wide, so the write
// runs in a child process of this test binary.
func TestAppendUndoesAShortWriteAtTheFileSizeLimit(t *testing.T) {
	if path := os.Getenv(fsizeChildEnv); path != "" {
		fsizeChild(path)
		return
	}
	path, good := goodLog(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestAppendUndoesAShortWriteAtTheFileSizeLimit$", "-test.count=1")
	cmd.Env = append(os.Environ(), fsizeChildEnv+"="+path)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "append: audit: entry 3 not written; the log is back at entry 2: ")
	assert.Contains(t, string(out), "file too large")
	assert.Contains(t, string(out), fmt.Sprintf("size at undo: %d\n", len(good)+40), "the kernel wrote part of the entry")
	assert.Contains(t, string(out), fmt.Sprintf("size after: %d", len(good)))
	assert.Equal(t, string(good), mustRead(t, path), "the short write was truncated away")

	l, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, l.Append(sampleEntries()[2]))
	require.NoError(t, l.Close())
	res, err := verifyFile(t, path)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), res.Entries)
}

// fsizeChild appends one entry with room for 40 more bytes only, reports
// what happened on standard output and exits.
func fsizeChild(path string) {
	fail := func(err error) {
		fmt.Println("child:", err)
		os.Exit(3)
	}
	osf, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fail(err)
	}
	l, err := openFile(sizeAtUndo{osf}, path)
	if err != nil {
		fail(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		fail(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fail(err)
	}
	lim.Cur = uint64(info.Size()) + 40
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fail(err)
	}
	fmt.Println("append:", l.Append(sampleEntries()[2]))
	if info, err = os.Stat(path); err != nil {
		fail(err)
	}
	fmt.Println("size after:", info.Size())
	os.Exit(0)
}

// sizeAtUndo reports how much of the entry the kernel wrote before the
// log truncated it away.
type sizeAtUndo struct{ *os.File }

func (f sizeAtUndo) Truncate(size int64) error {
	if info, err := f.Stat(); err == nil {
		fmt.Println("size at undo:", info.Size())
	}
	return f.File.Truncate(size)
}
