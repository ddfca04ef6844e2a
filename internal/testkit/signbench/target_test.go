package signbench

import (
	"context"
	"crypto/ecdsa"
	"testing"
)

// target is one signing server under load, running in a process of its
// own: trustbridge (trustbridge_test.go) or SPIRE (spire_test.go).
type target interface {
	// Name labels the benchmark row ("trustbridge", "spire", ...).
	Name() string
	// PID is the server's process, whose CPU time and peak resident
	// memory are read from /proc.
	PID() int
	// CSR is a certificate signing request for key, DER, as this
	// server's clients send it for the identity the target's clients
	// hold; the benchmarks make them before the clock starts.
	CSR(tb testing.TB, key *ecdsa.PrivateKey) []byte
	// Dial opens one client on a connection of its own (TLS handshake
	// done before it returns), authenticated as the workload or agent
	// the target set up.
	Dial(tb testing.TB) client
}

// client is one connection's worth of calls; one goroutine uses it.
type client interface {
	// X509 asks for one X509-SVID for csr (from target.CSR) and checks
	// that an answer with a certificate came back. A refusal is returned
	// as the gRPC status error.
	X509(ctx context.Context, csr []byte) error
	// JWT asks for one JWT-SVID for audience and checks that a token
	// came back.
	JWT(ctx context.Context, audience string) error
	// Close closes the connection.
	Close() error
}

// targetOptions are how a target's server is configured.
type targetOptions struct {
	// SigningRateLimit keeps the server's per-caller signing rate limit
	// as it ships (SPIRE: 500 signings a second per IP address;
	// trustbridge: none by default); false turns it off where it can be.
	SigningRateLimit bool
}

// newTarget starts a fresh server and registers what its clients need;
// the server is stopped by tb.Cleanup.
type newTarget func(tb testing.TB, opts targetOptions) target
