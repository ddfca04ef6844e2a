package certservice

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Results of a renewal's grant check, the result label of
// trustbridge_certservice_renewal_grant_checks_total.
const (
	grantAccepted         = "accepted"
	grantRevoked          = "revoked"
	grantUnavailable      = "unavailable"
	grantInvalid          = "invalid"
	grantLifetimeExceeded = "lifetime_exceeded"
)

// grantFor decides the grant the new certificate records, and whether the
// request may have one at all.
//
// A token method is a first issuance: the grant is the token's, dated now.
// A renewal by X509-SVID copies the presented SVID's grant unchanged, so a
// whole chain names the credential it started from, after checking that
// the chain is not older than MaxRenewalLifetime and that the credential
// still exists. An SVID without a grant (legacy: issued before grants were
// recorded, or by `ca issue`) renews with a warning; its copy is dated at
// that SVID's NotBefore, so MaxRenewalLifetime ends such chains too. An
// SVID SDS minted for Envoy never renews.
//
// ok is false, with ext unset, when the authenticator reported no grant
// for a token method: the certificate then records none.
func (s *Service) grantFor(ctx context.Context, ident authn.Identity, peer string) (ext pkix.Extension, g authn.Grant, ok bool, ref *refusal) {
	now := s.cfg.Clock.Now()
	if ident.Method != authn.MethodX509SVID {
		if ident.Grant == nil {
			return ext, g, false, nil
		}
		g = *ident.Grant
		if g.GrantedAt.IsZero() {
			g.GrantedAt = now
		}
	} else {
		var ref *refusal
		if g, ref = s.checkRenewal(ctx, ident, peer); ref != nil {
			return ext, g, false, ref
		}
	}
	ext, err := g.Extension()
	if err != nil {
		return ext, g, false, &refusal{codes.Internal, "internal", "internal error", err}
	}
	return ext, g, true, nil
}

// checkRenewal judges the grant of the SVID a renewal presented, with
// the policy (authn.GrantPolicy) SDS's authenticators apply too.
func (s *Service) checkRenewal(ctx context.Context, ident authn.Identity, peer string) (authn.Grant, *refusal) {
	p, err := s.policy.Check(ctx, ident)
	var g authn.Grant
	method := "unknown"
	if p != nil {
		g, method = *p, p.Method
	}
	switch {
	case err == nil && g.Method == authn.GrantMethodLegacy:
		s.metrics.grantChecks.WithLabelValues(method, grantAccepted).Inc()
		s.cfg.Logger.Warn("renewing a certificate that records no grant; it cannot be revoked by removing a token or service account (set a maximum renewal lifetime to end such chains)",
			logattr.SPIFFEID, ident.ID.String(), logattr.GrantedAt, g.GrantedAt.UTC().Format(time.RFC3339), logattr.Address, peer)
		return g, nil
	case err == nil:
		s.metrics.grantChecks.WithLabelValues(method, grantAccepted).Inc()
		return g, nil
	case errors.Is(err, authn.ErrNotIssuedHere):
		// Signed by another CA of the trust domain (a downstream's
		// intermediate, the upstream): whatever grant it records, this
		// server did not write it.
		s.metrics.grantChecks.WithLabelValues(method, grantInvalid).Inc()
		return g, &refusal{codes.PermissionDenied, "grant_invalid", notIssuedHereMessage, err}
	case errors.Is(err, authn.ErrGrantUnreadable):
		s.metrics.grantChecks.WithLabelValues(method, grantInvalid).Inc()
		return g, &refusal{codes.PermissionDenied, "grant_invalid",
			"the presented certificate's grant record cannot be read; obtain a new certificate with a bootstrap or service account token", err}
	case errors.Is(err, authn.ErrGrantExpired):
		s.metrics.grantChecks.WithLabelValues(method, grantLifetimeExceeded).Inc()
		return g, &refusal{codes.PermissionDenied, "renewal_lifetime_exceeded", s.lifetimeMessage(ident.ID, g), err}
	case errors.Is(err, authn.ErrGrantRevoked):
		s.metrics.grantChecks.WithLabelValues(method, grantRevoked).Inc()
		return g, &refusal{codes.PermissionDenied, "grant_revoked", revokedMessage(ident.ID, g, s.cfg.Grants[g.Method] == nil), err}
	case errors.Is(err, authn.ErrUnavailable):
		s.metrics.grantChecks.WithLabelValues(method, grantUnavailable).Inc()
		return g, &refusal{codes.Unavailable, "grant_unavailable", "cannot check the grant behind this certificate right now; retry later", err}
	}
	s.metrics.grantChecks.WithLabelValues(method, grantInvalid).Inc()
	return g, &refusal{codes.Internal, "internal", "internal error", err}
}

// notIssuedHereMessage tells the holder of a certificate another CA of
// the trust domain signed where it renews; the issuer is in the log.
const notIssuedHereMessage = "the presented certificate was not issued by this server's CA, so its grant record is not this server's; " +
	"renew it at the CA that issued it, or obtain a new certificate here with a bootstrap or service account token"

// boundTTL shortens ttl so that the certificate of grant g ends by the
// bound its checker sets (authn.GrantBounder: an OIDC or remote cluster
// issuer's maxRenewalLifetime after the token), so that a certificate
// bought or renewed near the end of a chain does not outlive it by a
// whole lifetime. Grants without such a bound keep ttl.
func (s *Service) boundTTL(ttl time.Duration, id spiffeid.ID, g authn.Grant, hasGrant bool) (time.Duration, *refusal) {
	if !hasGrant {
		return ttl, nil
	}
	b, ok := s.cfg.Grants[g.Method].(authn.GrantBounder)
	if !ok {
		return ttl, nil
	}
	end, ok := b.GrantNotAfter(g)
	if !ok {
		return ttl, nil
	}
	left := end.Sub(s.cfg.Clock.Now()).Truncate(time.Second)
	if left < time.Second {
		return 0, &refusal{codes.PermissionDenied, "renewal_lifetime_exceeded", s.lifetimeMessage(id, g), nil}
	}
	if ttl == 0 {
		ttl = s.cfg.DefaultTTL
	}
	if ttl == 0 || ttl > left {
		ttl = left
	}
	return ttl, nil
}

// lifetimeMessage says which bound ended a renewal chain: the server's
// MaxRenewalLifetime, or else the bound of the token issuer that granted
// it (its maxRenewalLifetime, which GrantPolicy does not know).
func (s *Service) lifetimeMessage(id spiffeid.ID, g authn.Grant) string {
	at := g.GrantedAt.UTC().Format(time.RFC3339)
	server := s.cfg.MaxRenewalLifetime
	issuer := g.Method == authn.MethodOIDC || g.Method == authn.MethodKubernetesIssuer
	if issuer && (server <= 0 || s.cfg.Clock.Since(g.GrantedAt) <= server) {
		return fmt.Sprintf("the renewal chain of %s was granted at %s by token issuer %q, longer ago than that issuer's maxRenewalLifetime allows; obtain a new certificate with a fresh token from it",
			id, at, g.Ref)
	}
	return fmt.Sprintf("the renewal chain of %s was granted at %s, more than the maximum renewal lifetime of %s ago; obtain a new certificate with a bootstrap or service account token",
		id, at, server)
}

// revokedMessage tells the caller what to do; it names the credential only
// as far as the caller's own certificate already does.
func revokedMessage(id spiffeid.ID, g authn.Grant, noChecker bool) string {
	switch {
	case g.Method == authn.GrantMethodSDS:
		return fmt.Sprintf("renewal refused: the certificate of %s was minted by SDS for Envoy and cannot be renewed; request one with a bootstrap or service account token", id)
	case noChecker:
		return fmt.Sprintf("%s was granted by a %s, which this server no longer accepts; obtain a new certificate with a credential it accepts", id, g.Method)
	}
	switch g.Method {
	case authn.MethodBootstrapToken:
		return fmt.Sprintf("renewal refused: the bootstrap token that granted %s (reference %s) was removed; bootstrap again with a current token", id, g.Ref)
	case authn.MethodKubernetesJWT:
		return fmt.Sprintf("renewal refused: the service account %s that granted %s was deleted or re-created; obtain a new certificate with a current service account token", g.Ref, id)
	}
	return fmt.Sprintf("renewal refused: the %s grant of %s was revoked", g.Method, id)
}

// grantAttrs are the log attributes recording a certificate's grant: the
// audit trail of which credential every certificate descends from.
func grantAttrs(attrs []slog.Attr, g authn.Grant) []slog.Attr {
	attrs = append(attrs, slog.String(logattr.GrantMethod, g.Method), slog.String(logattr.GrantedAt, g.GrantedAt.UTC().Format(time.RFC3339)))
	if g.Ref != "" {
		attrs = append(attrs, slog.String(logattr.GrantRef, g.Ref))
	}
	if g.UID != "" {
		attrs = append(attrs, slog.String(logattr.GrantUID, g.UID))
	}
	return attrs
}
