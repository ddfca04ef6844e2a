//go:build !unix

package main

import (
	"errors"
	"net"
)

func listenUnixPrivate(string) (net.Listener, error) {
	return nil, errors.New("unix sockets are not supported on this platform")
}
