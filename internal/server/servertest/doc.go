// Package servertest holds what the tests of the trustbridge server
// (internal/server) and of its CLI (cmd/trustbridge) share to drive a
// running server: its admin API, its logs, the files it reads and the
// connections a flood opens. It is imported only by tests.
//
// It does not import internal/server: that package's own tests (package
// server) import it, and Go refuses an import cycle through a test. What
// needs a server.Config (starting a server) stays with each test package.
package servertest
