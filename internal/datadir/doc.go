// Package datadir keeps one writer per trustbridge data directory.
//
// A server takes an exclusive flock(2) on <data-dir>/trustbridge.lock for
// as long as it runs and writes who it is into the file: process ID, host,
// start time and command. A second server on the same directory fails at
// once with an error (a *HeldError) naming that holder, before it reads or
// writes anything else there. The kernel releases the lock when the holder
// exits, cleanly or not, so a lock file left by a crashed server does not
// block the next start: only a held lock does, never the file's content.
//
//	lock, err := datadir.Acquire(dir, datadir.Self("trustbridge server"))
//	if err != nil {
//		return fmt.Errorf("--data-dir: %w", err) // names the holder
//	}
//	defer lock.Release()
//
// Probe tells other commands (ca rotate, ca issue) whether a server holds
// a directory without taking the lock for longer than the call.
//
// The lock is advisory and per host: it guards against a second
// trustbridge, not against other programs, and over NFS only as far as
// the server's lock manager does. Where flock is not available (not unix)
// Acquire records the holder but excludes no one; Supported says which.
package datadir
