//go:build !unix

package backup

import (
	"os"
)

// openSource opens a file to archive.
func openSource(p string) (*os.File, error) { return os.Open(p) }

// mountPoint cannot tell here; a rename that fails with EBUSY takes the
// mount point path all the same.
func mountPoint(string) bool { return false }
