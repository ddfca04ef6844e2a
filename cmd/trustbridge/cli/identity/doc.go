// Package identity is trustbridge identity: explain, which shows which
// SPIFFE ID (with its TTL and DNS names) the identity map gives one
// described workload, which rules selected it and why, from the running
// server or from an identity map file.
package identity
