//go:build !unix

package fileutil

// SyncDir: directories cannot be synced here.
func SyncDir(string) error { return nil }
