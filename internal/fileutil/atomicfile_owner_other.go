//go:build !unix

package fileutil

import "io/fs"

// ownerOf: elsewhere ownership is not a uid and gid; Replace is Write.
func ownerOf(fs.FileInfo) (uid, gid int, ok bool) { return 0, 0, false }
