// Package token is trustbridge token create: a fresh random bootstrap token
// for one identity, added to the server's --bootstrap-token-file.
package token
