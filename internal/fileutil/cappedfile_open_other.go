//go:build !unix

package fileutil

// openNonblock: elsewhere a FIFO path is not expected.
const openNonblock = 0
