//go:build !unix

package backup

import (
	"errors"
	"os"
)

// ErrBusy: a process holds a lock in the data directory.
var ErrBusy = errors.New("data directory in use")

// Busy cannot tell where flock is unavailable: stop the server before a
// restore.
func Busy(string) error { return nil }

// openSource opens a file to archive.
func openSource(p string) (*os.File, error) { return os.Open(p) }
