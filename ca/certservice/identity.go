package certservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// Bounds of a MintJWTSVID request (identityapi's). A JWT-SVID names a
// handful of audiences (an OIDC client ID, a URL); these leave room for
// any real one while keeping a token well under what HTTP headers carry.
const (
	// MaxAudiences is the most audiences one JWT-SVID may name.
	MaxAudiences = identityapi.MaxAudiences
	// MaxAudienceBytes bounds one audience value.
	MaxAudienceBytes = identityapi.MaxAudienceBytes
	// maxMintRequestSize bounds the whole request.
	maxMintRequestSize = identityapi.MaxMintRequestBytes
)

// JWTSigner signs JWT-SVIDs for identities the service authenticated.
// ttl 0 takes the signer's default, a ttl over its maximum is clamped;
// it returns the compact token and its expiry. *ca.Authority implements
// it. Errors wrapping jwtsvid.ErrInvalidClaims, or with
// ca.SignErrorKind "invalid_ttl", describe the request; kind
// "signing_material" means the signer cannot sign now.
type JWTSigner interface {
	SignJWT(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error)
}

// JWTSignerFunc adapts a function to JWTSigner.
type JWTSignerFunc func(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error)

// SignJWT calls f.
func (f JWTSignerFunc) SignJWT(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
	return f(id, audience, ttl)
}

// BundleSource is every trust domain's bundle, the local one included, at
// one moment, and a channel closed once that changes (nil never fires).
// The bundles are shared and never changed.
type BundleSource interface {
	Bundles() ([]*spiffebundle.Bundle, <-chan struct{})
}

// BundleSourceFunc adapts a function to BundleSource.
type BundleSourceFunc func() ([]*spiffebundle.Bundle, <-chan struct{})

// Bundles calls f.
func (f BundleSourceFunc) Bundles() ([]*spiffebundle.Bundle, <-chan struct{}) { return f() }

// AccessPolicy decides which trust domains, and which of their peers, an
// authenticated caller may trust (sds.AccessPolicy has the same shape,
// and trustpolicy.Access implements both). Decide returns a channel
// closed when the decision may have changed; nil never fires.
type AccessPolicy interface {
	Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{})
}

// AccessPolicyFunc adapts a function to AccessPolicy.
type AccessPolicyFunc func(ident authn.Identity) (trustpolicy.Decision, <-chan struct{})

// Decide calls f.
func (f AccessPolicyFunc) Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	return f(ident)
}

// identityService is trustbridge.identity.v1.IdentityService on a
// Service: the same authenticators, limits and refusal logs.
type identityService struct {
	identityapi.UnimplementedIdentityServiceServer
	s *Service
}

// identityAuthenticator is what every identity service call
// (MintJWTSVID(s), WatchBundles, SignIntermediate) accepts: as for
// certificates, except that a renewal chain whose grant no longer stands
// does not authenticate (as on SDS), and a single-use bootstrap token,
// which buys one certificate, buys nothing here.
func identityAuthenticator(cfg Config, p *authn.GrantPolicy) authn.Authenticator {
	return authn.ReusableOnly(authn.RequireGrant(cfg.Authenticator, p))
}

// MintJWTSVID signs a JWT-SVID for the caller's proven identity.
func (is *identityService) MintJWTSVID(ctx context.Context, req *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, error) {
	return answer(ctx, is.s, is.s.metrics.jwtSVIDs, "jwt-svid request refused", req, is.s.mint)
}

func (s *Service) mint(ctx context.Context, r authn.Request, req *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, authn.Identity, *refusal) {
	if s.cfg.JWT == nil {
		return nil, authn.Identity{}, errJWTNotConfigured
	}
	if proto.Size(req) > maxMintRequestSize {
		return nil, authn.Identity{}, mintTooLarge()
	}
	ident, ref := s.authenticate(ctx, r, s.identityAuth)
	if ref != nil {
		return nil, ident, ref
	}
	d, ref := s.decideMint(ctx, ident, req)
	if ref != nil {
		return nil, ident, ref
	}
	release, ref := s.admission.acquire(ctx, proto.Size(req), ident.Spend == nil)
	if ref != nil {
		return nil, ident, ref
	}
	defer release()
	resp, ref := s.signMint(ctx, r, ident, d)
	return resp, ident, ref
}

// errJWTNotConfigured refuses every mint of a server without a JWT
// signer.
var errJWTNotConfigured = &refusal{codes.FailedPrecondition, "not_configured", "this server does not mint JWT-SVIDs", nil}

func mintTooLarge() *refusal {
	return &refusal{codes.ResourceExhausted, "too_large", fmt.Sprintf("request larger than %d bytes", maxMintRequestSize), nil}
}

// mintDecision is a JWT-SVID request judged and charged, to be signed
// once it has a signing slot.
type mintDecision struct {
	subject  spiffeid.ID
	audience []string
	ttl      time.Duration
}

// decideMint judges one JWT-SVID request of ident, a caller already
// authenticated (MintJWTSVID's request, or one item of a MintJWTSVIDs
// batch): its audiences and lifetime, the time its credential has left,
// the workload it may name, and its charge to the rate limit.
func (s *Service) decideMint(ctx context.Context, ident authn.Identity, req *identityapi.MintJWTSVIDRequest) (mintDecision, *refusal) {
	audience, ttl, ref := checkMintRequest(req)
	if ref != nil {
		return mintDecision{}, ref
	}
	if ref := checkCredentialLeft(ident.NotAfter, s.cfg.Clock.Now()); ref != nil {
		return mintDecision{}, ref
	}
	// The subject is the identity the caller proved, or the workload a
	// node agent proved it may act for; nothing else in the request can
	// name another.
	subject := ident.ID
	if v := req.GetImpersonatedIdentity(); v != "" {
		if subject, ref = s.authorizeImpersonation(ctx, ident, jwtImpersonation, v); ref != nil {
			return mintDecision{}, ref
		}
	}
	if ref := s.admission.charge(ident, subject); ref != nil {
		return mintDecision{}, ref
	}
	return mintDecision{subject: subject, audience: audience, ttl: ttl}, nil
}

// signMint signs what decideMint decided, holding a signing slot, and
// logs it. The credential's time left is read again: the request may
// have waited in the queue since it was judged.
func (s *Service) signMint(ctx context.Context, r authn.Request, ident authn.Identity, d mintDecision) (*identityapi.MintJWTSVIDResponse, *refusal) {
	credExp, now := ident.NotAfter, s.cfg.Clock.Now()
	if ref := checkCredentialLeft(credExp, now); ref != nil {
		return nil, ref
	}
	token, exp, err := s.signJWT(d.subject, d.audience, d.ttl, credExp, now)
	if err == nil && (token == "" || !exp.After(s.cfg.Clock.Now())) {
		err = errors.New("signer returned no token, or one already expired")
	}
	if err != nil {
		return nil, jwtRefusal(err)
	}
	s.logJWTIssued(ctx, r, ident, d.subject, d.audience, exp)
	return &identityapi.MintJWTSVIDResponse{Token: token, SpiffeId: d.subject.String(), ExpiresAt: exp.Unix()}, nil
}

// logJWTIssued logs a JWT-SVID for subject issued to ident, with typed
// attributes (this runs for every token), and nothing when Info is off.
func (s *Service) logJWTIssued(ctx context.Context, r authn.Request, ident authn.Identity, subject spiffeid.ID, audience []string, exp time.Time) {
	if !s.cfg.Logger.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := make([]slog.Attr, 0, 6)
	attrs = append(attrs, slog.String(logattr.SPIFFEID, ident.ID.String()), slog.String("method", ident.Method),
		slog.String("audience", strings.Join(audience, ",")), slog.String("expires_at", exp.UTC().Format(time.RFC3339)), slog.String(logattr.Address, r.Peer))
	if subject != ident.ID {
		attrs = append(attrs, slog.String(logattr.Impersonated, subject.String()))
	}
	s.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "jwt-svid issued", attrs...)
}

// minCredentialLeft is the least time the caller's credential must have
// left to buy a JWT-SVID: one shorter is useless to anyone receiving it.
const minCredentialLeft = time.Second

// checkCredentialLeft refuses a caller whose credential (expiring at
// credExp, zero when unknown) has less than minCredentialLeft left.
func checkCredentialLeft(credExp, now time.Time) *refusal {
	if credExp.IsZero() || credExp.Sub(now) >= minCredentialLeft {
		return nil
	}
	return &refusal{codes.Unauthenticated, "credential_expiring",
		fmt.Sprintf("the credential you authenticated with expires at %s, in under %s; renew it and ask again", credExp.UTC().Format(time.RFC3339), minCredentialLeft), nil}
}

// signJWT signs a JWT-SVID that expires no later than the credential
// that bought it (credExp, zero when unknown): a token must not prove an
// identity for longer than its holder could. A request over what the
// credential has left is clamped to it; the signer's default, which the
// service does not know, is signed again clamped when it would outlive it.
// now is when checkCredentialLeft found at least a second left, so the
// clamp is never 0, which would mean the default.
func (s *Service) signJWT(id spiffeid.ID, audience []string, ttl time.Duration, credExp, now time.Time) (string, time.Time, error) {
	if credExp.IsZero() {
		return s.cfg.JWT.SignJWT(id, audience, ttl)
	}
	left := max(credExp.Sub(now).Truncate(time.Second), minCredentialLeft)
	if ttl > left {
		ttl = left
	}
	token, exp, err := s.cfg.JWT.SignJWT(id, audience, ttl)
	if err == nil && exp.After(credExp) {
		token, exp, err = s.cfg.JWT.SignJWT(id, audience, left)
	}
	return token, exp, err
}

// checkMintRequest returns the audiences and lifetime a request asks for,
// or why it cannot be served: no audience, too many, an empty, oversized,
// non-UTF-8 or control-character one, a negative lifetime.
func checkMintRequest(req *identityapi.MintJWTSVIDRequest) ([]string, time.Duration, *refusal) {
	aud := req.GetAudience()
	bad := func(format string, args ...any) ([]string, time.Duration, *refusal) {
		return nil, 0, &refusal{codes.InvalidArgument, "invalid_audience", fmt.Sprintf(format, args...), nil}
	}
	if err := CheckAudiences(aud); err != nil {
		return bad("%s", err)
	}
	ttl, ref := validity("ttl_seconds", req.GetTtlSeconds())
	if ref != nil {
		return nil, 0, ref
	}
	return aud, ttl, nil
}

// CheckAudiences refuses audiences no JWT-SVID may name: none, too
// many, an empty, oversized, non-UTF-8 or control-character one. Every
// path that mints (MintJWTSVID, the admin API's operator mint) checks
// them so.
func CheckAudiences(aud []string) error {
	switch {
	case len(aud) == 0:
		return errors.New("audience is required: name at least one party the token is for")
	case len(aud) > MaxAudiences:
		return fmt.Errorf("%d audiences requested; at most %d are allowed", len(aud), MaxAudiences)
	}
	for i, a := range aud {
		switch {
		case a == "":
			return fmt.Errorf("audience %d is empty", i+1)
		case len(a) > MaxAudienceBytes:
			return fmt.Errorf("audience %d is %d bytes; at most %d are allowed", i+1, len(a), MaxAudienceBytes)
		case !utf8.ValidString(a):
			return fmt.Errorf("audience %d is not valid UTF-8", i+1)
		case strings.ContainsFunc(a, unicode.IsControl):
			// As the Workload API refuses them: an audience is a name or a
			// URL, and a control character in a token's aud only misleads
			// whoever reads it (logs, audit, a naive comparison).
			return fmt.Errorf("audience %d holds a control character", i+1)
		}
	}
	return nil
}

// jwtRefusal maps the signer's errors: about the request, or the signer
// unable to sign now; anything else is our fault, kept in the log.
func jwtRefusal(err error) *refusal {
	kind := ca.SignErrorKind(err)
	switch {
	case errors.Is(err, jwtsvid.ErrInvalidClaims), kind == "invalid_ttl":
		return &refusal{codes.InvalidArgument, "invalid_claims", clientMessage(err), nil}
	case kind == "identity_not_allowed":
		return &refusal{codes.PermissionDenied, kind, clientMessage(err), nil}
	case kind == "signing_material", errors.Is(err, jwtsvid.ErrInvalidKey):
		return &refusal{codes.Unavailable, "signing_material", "the CA cannot sign JWT-SVIDs right now; retry later", err}
	}
	return &refusal{codes.Internal, "internal", "internal error", err}
}
