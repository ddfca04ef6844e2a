//go:build !unix

package atomicfile

// SyncDir: directories cannot be synced here.
func SyncDir(string) error { return nil }
