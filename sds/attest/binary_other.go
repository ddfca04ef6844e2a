//go:build !linux

package attest

import "os"

// keyOf never keys a file outside Linux: every attestation hashes.
func keyOf(os.FileInfo) (fileKey, bool) { return fileKey{}, false }

// idOf never names a file outside Linux (nor does the attestor run there).
func idOf(os.FileInfo) (fileID, bool) { return fileID{}, false }
