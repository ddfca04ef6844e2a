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
// Install puts the checked directory in place and never deletes data: a
// non-empty target is refused, or with force moved aside.
//
//	files, err := backup.Collect(dataDir, ca.StateDir)
//	err = backup.Write(out, backup.Manifest{TrustDomain: td, Sequence: seq, Created: now}, append(stateFiles, files...))
//
//	staged, _ := os.MkdirTemp(filepath.Dir(target), ".restore-")
//	m, err := backup.Extract(in, staged, backup.DefaultLimits)
//	replaced, err := backup.Install(staged, target, force, now)
package backup
