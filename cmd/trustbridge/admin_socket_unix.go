//go:build unix

package main

import (
	"net"
	"os"
	"syscall"
)

var umaskMu = make(chan struct{}, 1)

// listenUnixPrivate binds a unix socket that only its owner can connect
// to: created under umask 077, then chmod 0600 for good measure. The
// umask is process-wide, so changes to it are serialized here.
func listenUnixPrivate(path string) (net.Listener, error) {
	umaskMu <- struct{}{}
	old := syscall.Umask(0o077)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	<-umaskMu
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}
