package sds

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// Resource names Envoy asks for, as SPIRE's agent and Istio's agent name
// them.
const (
	// DefaultName is the caller's own certificate and key
	// (tls_certificate). A resource named by the caller's SPIFFE ID is the
	// same certificate.
	DefaultName = "default"
	// RootCAName is the local trust domain's roots (validation_context),
	// or, with Config.RootCA set to RootCASPIFFE, what AllName holds.
	RootCAName = "ROOTCA"
	// AllName is every trust domain's roots as Envoy's SPIFFE certificate
	// validator configuration, or as one trusted_ca for Envoys that set
	// DisableSPIFFEValidationKey in their node metadata.
	AllName = "ALL"
)

const (
	// SPIFFEValidatorName is the name of Envoy's SPIFFE certificate
	// validator extension.
	SPIFFEValidatorName = "envoy.tls.cert_validator.spiffe"
	// DisableSPIFFEValidationKey is the node metadata key (bool true, or
	// a string strconv.ParseBool reads as true, as SPIRE's agent accepts)
	// that makes ALL (and ROOTCA under RootCASPIFFE) a plain trusted_ca.
	DisableSPIFFEValidationKey = "disable_spiffe_cert_validation"
)

// MaxRequestSize bounds one SDS request message. Envoy repeats its node
// on a stream's first request, with its extensions and, under Istio, many
// kilobytes of metadata: far more than a certificate request needs. A
// gRPC server that serves both must raise its receive limit to this and
// let the certificate service bound its own requests.
const MaxRequestSize = 1 << 20

// ErrNoCredential means a CredentialSource has no credential for the
// identity (yet); the server answers Unavailable.
var ErrNoCredential = errors.New("no credential for this identity")

// Credential is one workload's X509-SVID and private key.
type Credential struct {
	// Chain is the leaf first, then intermediates; no roots.
	Chain []*x509.Certificate
	// Key is the private key of Chain[0].
	Key crypto.Signer
	// RefreshAt, when not zero, is when the server re-authenticates the
	// caller and asks the source again.
	RefreshAt time.Time
	// Changed, when not nil, is closed once the source holds a newer
	// credential for the same identity.
	Changed <-chan struct{}
}

// CredentialSource hands out the credential of an identity the server
// authenticated. It is never asked for an identity the caller did not
// prove.
type CredentialSource interface {
	Credential(ctx context.Context, id spiffeid.ID) (*Credential, error)
}

// CredentialSourceFunc adapts a function to CredentialSource.
type CredentialSourceFunc func(ctx context.Context, id spiffeid.ID) (*Credential, error)

// Credential calls f.
func (f CredentialSourceFunc) Credential(ctx context.Context, id spiffeid.ID) (*Credential, error) {
	return f(ctx, id)
}

// Trust is every trust domain's X.509 roots at one moment. It is never
// changed once published.
type Trust struct {
	// Bundles holds one bundle per trust domain, sorted by trust domain
	// name.
	Bundles []*x509bundle.Bundle
	// Changed is closed when a newer Trust is available.
	Changed <-chan struct{}
}

// TrustSource returns the current Trust.
type TrustSource interface {
	Trust() *Trust
}

// Signer issues an X509-SVID for id, an identity SDS authenticated, to
// the public key pub of a key the minter generated in this process: no
// CSR, since nobody else holds the key. It returns the leaf first, then
// any intermediates, without roots.
type Signer interface {
	Sign(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error)
}

// SignerFunc adapts a function to Signer.
type SignerFunc func(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error)

// Sign calls f.
func (f SignerFunc) Sign(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
	return f(pub, id, ttl)
}

// AccessPolicy decides which trust domains, and which of their peers, an
// authenticated caller may trust. Decide returns the caller's decision and
// a channel closed when it may have changed (a policy edit, new service
// account labels); nil never fires. The zero Decision (no policy) trusts
// every trust domain.
type AccessPolicy interface {
	Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{})
}

// AccessPolicyFunc adapts a function to AccessPolicy.
type AccessPolicyFunc func(ident authn.Identity) (trustpolicy.Decision, <-chan struct{})

// Decide calls f.
func (f AccessPolicyFunc) Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	return f(ident)
}
