package authn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Methods name how an Identity was proved; they appear in logs, metrics and
// Chain's error message.
const (
	MethodX509SVID       = "x509-svid"
	MethodKubernetesJWT  = "kubernetes-jwt"
	MethodBootstrapToken = "bootstrap-token"
	// MethodOIDC is a JWT from a configured OpenID Connect issuer (a CI
	// platform, a cloud, a VM's identity provider), verified offline
	// against the issuer's published keys; the SPIFFE ID comes from the
	// issuer's template.
	MethodOIDC = "oidc"
	// MethodKubernetesIssuer is a service account token of another
	// Kubernetes cluster, verified offline against that cluster's service
	// account issuer (discovery and JWKS) instead of a TokenReview; the
	// identity is spiffe://<td>/ns/<namespace>/sa/<name> from its
	// kubernetes.io claims.
	MethodKubernetesIssuer = "kubernetes-issuer"
	// MethodAttestation is a process on the node agent's own node,
	// identified by workload attestation (sds/attest: the kernel's account
	// of the socket's peer, its cgroup, its pod) and given the identity
	// the identity map grants those facts.
	MethodAttestation = "attestation"
)

// IsKubernetesMethod reports whether method (an Identity's, or a Grant's)
// is a Kubernetes service account token: reviewed by the local API server
// or verified against a remote cluster's issuer.
func IsKubernetesMethod(method string) bool {
	return method == MethodKubernetesJWT || method == MethodKubernetesIssuer
}

// MaxTokenSize is the largest bearer token accepted, in bytes. Kubernetes
// service account tokens are about 1 KiB; anything near this size is not one
// and is refused before any work is spent on it.
const MaxTokenSize = 16 << 10

var (
	// ErrNoCredentials means an authenticator found nothing it handles in the
	// request (no client certificate, no bearer token, a token of another
	// kind). It is always wrapped.
	ErrNoCredentials = errors.New("no credentials")
	// ErrInvalidCredentials means the caller presented credentials the
	// authenticator handles, and they did not prove an identity.
	ErrInvalidCredentials = errors.New("invalid credentials")
	// ErrUnavailable means the authenticator could not reach the system that
	// decides (the Kubernetes API server); a retry may succeed. Chain's error
	// wraps it too, so a transport may answer Unavailable instead of
	// Unauthenticated.
	ErrUnavailable = errors.New("authentication backend unavailable")
	// ErrPermissionDenied means the credentials were valid but the identity
	// they would prove is not allowed: a token from a configured issuer
	// whose claims do not satisfy the issuer's rules, or whose claim values
	// cannot form a SPIFFE ID. Transports answer PermissionDenied rather
	// than Unauthenticated (unless another authenticator was unavailable).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnauthenticated is returned (wrapped) by Chain when no authenticator
	// succeeded.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrNotAttested means workload attestation refused the calling
	// process, or its facts grant no identity. The caller is a process on
	// the same node, whose operator needs the reason: transports return
	// the error's text to it (PermissionDenied, or Unavailable when it
	// also wraps ErrUnavailable).
	ErrNotAttested = errors.New("not attested")
)

// Request is what a caller presented on one call.
type Request struct {
	// PeerCertificates is the client's TLS certificate chain as sent (leaf
	// first), NOT verified by TLS.
	PeerCertificates []*x509.Certificate
	// BearerToken is the token from the "authorization: Bearer <token>"
	// header, without the prefix ("" if absent or unusable).
	BearerToken string
	// AuthorizationError is set when the caller sent authorization metadata
	// that cannot be used: more than one value, a scheme other than Bearer,
	// an empty, malformed or oversized token. BearerToken is then "", and
	// the token authenticators refuse the call with ErrInvalidCredentials
	// (carrying this reason) instead of ErrNoCredentials. The message never
	// holds token bytes.
	AuthorizationError error
	// Peer identifies the remote end for logs and rate limits (e.g.
	// "127.0.0.1:5555").
	Peer string
	// ClusterIDs are the "ClusterID" metadata values Istio's agents and
	// ztunnel send: the Kubernetes cluster their service account token
	// comes from (none means the local one).
	ClusterIDs []string
}

// Identity is who the caller proved to be.
type Identity struct {
	ID spiffeid.ID
	// Method is MethodX509SVID, MethodKubernetesJWT, MethodKubernetesIssuer,
	// MethodOIDC or MethodBootstrapToken.
	Method string
	// Grant is the credential that first granted ID: the token itself for
	// the token methods, the grant recorded in the certificate for
	// MethodX509SVID (see GrantFromCert). Nil when the authenticator does
	// not know it.
	Grant *Grant
	// GrantErr is set instead of Grant when a verified X509-SVID carries a
	// grant extension that does not parse.
	GrantErr error
	// Pod is the pod a Kubernetes service account token is bound to, as
	// the API server said in its TokenReview; zero for other methods and
	// for tokens not bound to a pod.
	Pod PodRef
	// Spend is set when the credential is single-use (a bootstrap token
	// without the reusable marker): whoever issues a certificate on this
	// identity calls it after signing and before handing the certificate
	// out, and withholds the certificate when it fails. It fails wrapping
	// ErrTokenConsumed and ErrInvalidCredentials when another request
	// spent the credential first, or ErrUnavailable when the spending
	// could not be recorded. A service that cannot spend it on one
	// certificate (an SDS stream) refuses the identity: see ReusableOnly.
	Spend func(ctx context.Context) error
	// DNSNames are the DNS names the certificate of this identity carries
	// beside ID when the authenticator decided them: the node agent's
	// identity map for an attested process. Nil otherwise.
	DNSNames []string
	// NotAfter is when the credential that proved this identity stops
	// proving it: an X509-SVID's NotAfter, a service account token's exp,
	// a bootstrap token's expires=. Zero when unknown (a bootstrap token
	// without expires=). A service that keeps a caller (a stream) ends it
	// then, without parsing the credential again.
	NotAfter time.Time
}

// PodRef names a pod and the incarnation of it (UID) a token was bound to.
type PodRef struct {
	Namespace, Name, UID string
}

// IsZero reports whether p names no pod.
func (p PodRef) IsZero() bool { return p.Name == "" }

// Authenticator decides who the caller of one request is. It returns an
// error wrapping ErrNoCredentials when the request carries nothing it
// handles, and another error (normally wrapping ErrInvalidCredentials or
// ErrUnavailable) when the credentials it handles do not prove an identity.
type Authenticator interface {
	Authenticate(ctx context.Context, r Request) (Identity, error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context, r Request) (Identity, error)

// Authenticate calls f.
func (f AuthenticatorFunc) Authenticate(ctx context.Context, r Request) (Identity, error) {
	return f(ctx, r)
}

// Chain tries each authenticator in order; the first success decides
// (Istio's model), so a caller with a valid client certificate is not
// refused for a bad bearer token next to it.
type Chain []Authenticator

// Authenticate returns the identity of the first authenticator that
// succeeds. Otherwise it returns a *ChainError, which wraps
// ErrUnauthenticated and every authenticator's error, so errors.Is also
// finds ErrInvalidCredentials or ErrUnavailable when one of them said so.
// An authenticator that reports success with an empty identity counts as a
// failure: the chain fails closed.
func (c Chain) Authenticate(ctx context.Context, r Request) (Identity, error) {
	if len(c) == 0 {
		return Identity{}, &ChainError{Reasons: []error{errors.New("authn: no authenticators configured")}}
	}
	reasons := make([]error, 0, len(c))
	for _, a := range c {
		if err := ctx.Err(); err != nil {
			reasons = append(reasons, fmt.Errorf("authn: %w", err))
			break
		}
		id, err := a.Authenticate(ctx, r)
		if err == nil && id.ID.IsZero() {
			err = fmt.Errorf("authn: authenticator %T returned an empty identity", a)
		}
		if err == nil {
			return id, nil
		}
		reasons = append(reasons, err)
	}
	return Identity{}, &ChainError{Reasons: reasons}
}

// ChainError is Chain's refusal: each authenticator's reason, in order.
type ChainError struct {
	Reasons []error
}

// Error lists each reason, without the "authn: " prefix each one carries.
// Reasons never hold token bytes.
func (e *ChainError) Error() string {
	var b strings.Builder
	b.WriteString("authn: ")
	b.WriteString(ErrUnauthenticated.Error())
	for i, r := range e.Reasons {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(strings.TrimPrefix(r.Error(), "authn: "))
	}
	return b.String()
}

// Unwrap returns ErrUnauthenticated followed by every reason.
func (e *ChainError) Unwrap() []error {
	return append([]error{ErrUnauthenticated}, e.Reasons...)
}

// noCredentials and invalid build an authenticator's errors:
// "authn: <method>: <reason>: <kind>".
func noCredentials(method, reason string) error {
	return fmt.Errorf("authn: %s: %s: %w", method, reason, ErrNoCredentials)
}

func invalid(method string, reason error) error {
	return fmt.Errorf("authn: %s: %w: %w", method, reason, ErrInvalidCredentials)
}

func invalidf(method, format string, args ...any) error {
	return invalid(method, fmt.Errorf(format, args...))
}
