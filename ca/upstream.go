package ca

import (
	"context"
	"crypto/x509"
	"time"
)

// UpstreamAuthority signs this CA's intermediate: another trustbridge's
// certificate service, the Kubernetes CSR API, or any PKI with a client
// (Config.Upstream). The Authority then signs workload certificates with
// the intermediate, and publishes the upstream's roots, not the
// intermediate, in its bundle.
//
// An implementation may also implement fmt.Stringer, naming the upstream
// for messages and status ("trustbridge upstream corp-ca.example:15012").
//
// A failed SignIntermediate is retried with backoff: from 5s doubling to
// 5m while the upstream cannot be reached, every 5m when the error is a
// refusal (upstream.Refused: the upstream said no, which asking again
// will not change until a configuration does). Until the first
// intermediate is signed the CA signs nothing, and Ready says why.
type UpstreamAuthority interface {
	// SignIntermediate asks the upstream to sign csrDER (a DER PKCS#10
	// request for spiffe://<trust domain>, made with a fresh key) as a CA
	// certificate valid for about ttl. The answer is checked before use
	// (CheckUpstreamChain): nothing an upstream returns is trusted as is.
	SignIntermediate(ctx context.Context, csrDER []byte, ttl time.Duration) (*UpstreamChain, error)
}

// UpstreamChain is an upstream's answer.
type UpstreamChain struct {
	// Chain starts with the certificate signed for the request, followed
	// by the upstream's own intermediates in order, up to and not
	// including a root.
	Chain []*x509.Certificate
	// Roots are the upstream trust anchors Chain verifies to. They are
	// published in this trust domain's bundle.
	Roots []*x509.Certificate
}
