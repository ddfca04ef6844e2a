// Package backup writes and reads archives of a trustbridge data directory
// (`trustbridge backup` and `trustbridge restore`).
//
// An archive is a gzip-compressed tar file (archive/tar, ustar/PAX) of
// three parts, in this order: manifest.json (format, trust domain, when,
// the published sequence), every file of the data directory under data/,
// and checksums.json (path, mode, size and SHA-256 of each file). The
// checksums come last so that a backup streams each file once, from a
// consistent read: the CA state as the ca package's loader accepted it
// under the state's lock, every other file as it was when opened (they are
// replaced by rename, so an open file never changes), an append-only log
// up to its last complete line.
//
// Reading is defensive: the archive comes from wherever the operator kept
// it. Extract accepts regular files with clean relative names under data/
// only, bounds the number of files and the bytes it inflates, writes into
// a new directory it then checks against checksums.json as a whole, never
// keeps group or other write permission, and leaves private keys 0600.
// OpenTarget locks the target data directory (datadir.Acquire) from the
// first check until Release, so no server starts on it mid-restore, and
// Install puts the checked directory in place and never deletes data: a
// non-empty target is refused, or with force moved aside. A target that
// is a mount point keeps its place: entries move instead of the
// directory, and lost+found stays.
//
//	files, err := backup.Collect(dataDir, ca.StateDir)
//	err = backup.Write(out, backup.Manifest{TrustDomain: td, Sequence: seq, Created: now}, append(stateFiles, files...))
//
//	t, err := backup.OpenTarget(target, backup.TargetOptions{Force: force, Commit: ca.StateDir, Command: "trustbridge restore"})
//	defer t.Release()
//	staged, err := t.StageDir()
//	m, err := backup.Extract(in, staged, backup.DefaultLimits)
//	replaced, err := t.Install(staged, now)
package backup
