// Package securedir refuses a state directory that someone other than
// trustbridge could write to: a group- or other-writable directory, or one
// owned by another user, lets that user plant a root key, a journal or an
// audit log that trustbridge would then trust or extend. It is checked at
// start, before anything in the directory is read.
//
//	if err := securedir.Ensure(dataDir); err != nil {
//		return fmt.Errorf("--data-dir: %w", err)
//	}
//
// Root may own the directory as well as the effective user (as OpenSSH's
// StrictModes allows): root can read and replace anything anyway, so a
// root-owned directory gives no one a power they lack, and package
// managers and volume mounts often create it so.
package fileutil
