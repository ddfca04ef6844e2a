package authn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"
)

// Errors of GrantPolicy.Check besides ErrGrantRevoked and ErrUnavailable;
// always wrapped.
var (
	// ErrGrantExpired means the renewal chain was granted longer ago than
	// the policy's MaxLifetime.
	ErrGrantExpired = errors.New("renewal chain older than the maximum renewal lifetime")
	// ErrGrantUnreadable means the SVID's grant record did not parse, or
	// the authenticator reported none.
	ErrGrantUnreadable = errors.New("grant record unreadable")
	// ErrNotIssuedHere means the SVID was not signed by this server's CA
	// (WithOwnIssuers), so its grant record, whoever wrote it, is not
	// this server's. An Identity's GrantErr wraps it; GrantPolicy.Check
	// then wraps ErrGrantUnreadable too.
	ErrNotIssuedHere = errors.New("certificate not issued by this server's CA")
)

// GrantChecker decides whether the grant behind id still stands: nil, an
// error wrapping ErrGrantRevoked when the credential that first granted id
// is gone, or one wrapping ErrUnavailable when it cannot tell right now.
// *BootstrapTokens and *ServiceAccountGrants implement it.
type GrantChecker interface {
	CheckGrant(ctx context.Context, id spiffeid.ID, g Grant) error
}

// GrantBounder is a GrantChecker whose grants also bound the life of the
// certificates they buy: a certificate of grant g must not outlive
// GrantNotAfter(g) when ok. *oidc.Authenticator implements it (an
// issuer's maxRenewalLifetime after the token), so that a certificate
// never outlives the time its token's claims stand for, whatever TTL the
// caller asked for.
type GrantBounder interface {
	GrantNotAfter(g Grant) (notAfter time.Time, ok bool)
}

// GrantPolicy decides whether an identity proved by an X509-SVID may still
// be renewed (by the certificate service) or served (by SDS): its chain's
// grant must still stand and be younger than MaxLifetime. Token methods
// are first grants and always pass.
type GrantPolicy struct {
	// Checkers decide grants by method (MethodBootstrapToken,
	// MethodKubernetesJWT). A grant whose method has none is revoked: the
	// server no longer accepts that kind of credential.
	Checkers map[string]GrantChecker
	// MaxLifetime, when positive, bounds the time since GrantedAt.
	MaxLifetime time.Duration
	// Clock; nil means the real clock.
	Clock clock.PassiveClock
}

// Check returns the grant of ident, which a renewal copies, and nil, or an
// error wrapping ErrGrantRevoked, ErrGrantExpired, ErrGrantUnreadable or
// ErrUnavailable; any other error is a fault of a checker. A legacy grant
// (GrantMethodLegacy) passes unless MaxLifetime says otherwise; callers
// warn about it. For a token method the grant is ident's own, or nil when
// the authenticator knows none.
func (p *GrantPolicy) Check(ctx context.Context, ident Identity) (*Grant, error) {
	if ident.Method != MethodX509SVID {
		return ident.Grant, nil
	}
	if ident.GrantErr != nil {
		return nil, fmt.Errorf("authn: %s: %w: %w", ident.ID, ErrGrantUnreadable, ident.GrantErr)
	}
	if ident.Grant == nil {
		return nil, fmt.Errorf("authn: %s: %w: the X509-SVID authenticator reported no grant", ident.ID, ErrGrantUnreadable)
	}
	g := *ident.Grant
	clk := p.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	if p.MaxLifetime > 0 && clk.Since(g.GrantedAt) > p.MaxLifetime {
		return &g, fmt.Errorf("authn: %s: granted at %s: %w of %s", ident.ID, g.GrantedAt.UTC().Format(time.RFC3339), ErrGrantExpired, p.MaxLifetime)
	}
	switch g.Method {
	case GrantMethodLegacy:
		return &g, nil
	case GrantMethodSDS:
		return &g, fmt.Errorf("authn: %s: the certificate was minted by SDS for Envoy and is not a credential for this server: %w", ident.ID, ErrGrantRevoked)
	}
	checker := p.Checkers[g.Method]
	if checker == nil {
		return &g, fmt.Errorf("authn: %s: granted by a %s, which this server no longer accepts: %w", ident.ID, g.Method, ErrGrantRevoked)
	}
	if err := checker.CheckGrant(ctx, ident.ID, g); err != nil {
		return &g, err
	}
	return &g, nil
}

// RequireGrant wraps an authenticator so that an identity proved by an
// X509-SVID whose grant no longer stands (GrantPolicy.Check) does not
// authenticate: a revoked chain cannot fall back on another service that
// shares the authenticators (SDS mints certificates too). A grant that
// cannot be checked right now is ErrUnavailable, so a caller may retry;
// any other refusal wraps ErrInvalidCredentials.
func RequireGrant(next Authenticator, p *GrantPolicy) Authenticator {
	return AuthenticatorFunc(func(ctx context.Context, r Request) (Identity, error) {
		ident, err := next.Authenticate(ctx, r)
		if err != nil || ident.Method != MethodX509SVID {
			return ident, err
		}
		if _, err := p.Check(ctx, ident); err != nil {
			if errors.Is(err, ErrUnavailable) {
				return Identity{}, fmt.Errorf("authn: %s: grant: %w", MethodX509SVID, err)
			}
			return Identity{}, invalid(MethodX509SVID, fmt.Errorf("grant: %w", err))
		}
		return ident, nil
	})
}

// GrantCheckerFunc adapts a function to GrantChecker.
type GrantCheckerFunc func(ctx context.Context, id spiffeid.ID, g Grant) error

// CheckGrant calls f.
func (f GrantCheckerFunc) CheckGrant(ctx context.Context, id spiffeid.ID, g Grant) error {
	return f(ctx, id, g)
}
