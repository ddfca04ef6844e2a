//go:build unix

package fileutil

import "os"

// SyncDir makes the renames, links and removals in dir durable: Write
// calls it after its rename, and callers that rename several files
// themselves call it once after the last.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
