//go:build unix

package fileutil

import "syscall"

const openNonblock = syscall.O_NONBLOCK
