//go:build unix

package cappedfile

import "syscall"

const openNonblock = syscall.O_NONBLOCK
