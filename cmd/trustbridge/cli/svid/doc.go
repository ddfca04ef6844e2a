// Package svid is trustbridge x509 mint and the admin path of jwt mint
// (--spiffe-id): an operator asks the running server's admin API for an
// SVID of any identity of its trust domain, as spire-server x509 mint and
// jwt mint do. The X.509 key is generated here and never leaves the
// machine; the server signs its CSR, clamps the lifetime to its maximum
// and records who asked in the audit log.
package svid
