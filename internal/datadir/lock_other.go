//go:build !unix

package datadir

import "os"

// Supported says whether Acquire excludes other processes here: without
// flock it only records the holder, so run one server per data directory
// by other means.
const Supported = false

func openLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}

func openForProbe(path string) (*os.File, error) { return os.Open(path) }

func tryLock(*os.File, bool) (bool, error) { return false, nil }

func lockWait(*os.File, bool) error { return nil }

func unlock(*os.File) error { return nil }

func alive(int) bool { return true }
