// Package token is trustbridge token create, list and revoke: the
// server's --bootstrap-token-file, a fresh random token for one identity
// added to it, its tokens listed by reference (never the tokens), and one
// removed with the running server reloading the file at once.
package token
