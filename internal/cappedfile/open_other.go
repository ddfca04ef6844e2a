//go:build !unix

package cappedfile

// openNonblock: elsewhere a FIFO path is not expected.
const openNonblock = 0
