// Package unixsock binds unix sockets that a process owns alone: created
// with their final mode before they get their name, a socket already at
// the path is replaced only when nothing answers on it, and Close removes
// the path only while it still names this socket (never a newer server's).
//
//	ln, err := unixsock.Listen(path, -1, func(p string) error { ... })
//	defer ln.Close()
package netutil
