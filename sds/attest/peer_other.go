//go:build !linux

package attest

import (
	"errors"
	"fmt"
	"os"
	"runtime"
)

var errNotLinux = fmt.Errorf("reading a unix socket's peer needs Linux, not %s: %w", runtime.GOOS, errors.ErrUnsupported)

func peerCred(int) (int32, uint32, uint32, error) { return 0, 0, 0, errNotLinux }
func peerPidfd(int) (int, error)                  { return -1, errNoPidfd }
func pidfdOpen(int32) (int, error)                { return -1, errNoPidfd }
func pidfdGone(int) (bool, error)                 { return false, errNotLinux }
func preparePidfd(int)                            {}
func pidfdWait(*os.File) error                    { return errNotLinux }
