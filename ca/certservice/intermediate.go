package certservice

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultMaxDownstreamTTL is the longest intermediate signed for a
// downstream trustbridge when Config.MaxDownstreamTTL is zero: the
// downstream renews at half life, so two days leave a day to fix an
// outage of this server, while a stolen intermediate is good for two days
// at most (there is no revocation).
const DefaultMaxDownstreamTTL = 48 * time.Hour

// maxIntermediateRequestSize bounds a SignIntermediate request: a CSR
// with an RSA-4096 key is under 2 KiB; this leaves room for any real one.
const maxIntermediateRequestSize = 16 << 10

// IntermediateSigner signs a downstream trustbridge's intermediate: a CA
// certificate for spiffe://<trust domain> only, path length 0, name
// constrained to the trust domain. csr comes from ca.ParseCSR. It returns
// the chain (the new certificate first) and the roots it verifies to.
// *ca.Authority implements it.
type IntermediateSigner interface {
	SignIntermediate(csr *x509.CertificateRequest, ttl time.Duration) (*ca.UpstreamChain, error)
}

// IntermediateSignerFunc adapts a function to IntermediateSigner.
type IntermediateSignerFunc func(csr *x509.CertificateRequest, ttl time.Duration) (*ca.UpstreamChain, error)

// SignIntermediate calls f.
func (f IntermediateSignerFunc) SignIntermediate(csr *x509.CertificateRequest, ttl time.Duration) (*ca.UpstreamChain, error) {
	return f(csr, ttl)
}

// SignIntermediate signs a downstream trustbridge's intermediate. Only a
// caller proving an X509-SVID (mTLS) whose SPIFFE ID is in
// Config.DownstreamAllow gets one: an intermediate is long-lived signing
// power over the whole trust domain, so no bearer token (bootstrap,
// service account, OIDC), which can be replayed or is held by workloads,
// buys one. Like every identity service call, that SVID's grant must
// still stand (identityAuthenticator): a certificate SDS minted for
// Envoy, or one whose token or service account is gone, or whose chain
// is older than MaxRenewalLifetime, which could not renew itself, buys
// no CA either.
func (is *identityService) SignIntermediate(ctx context.Context, req *identityapi.SignIntermediateRequest) (*identityapi.SignIntermediateResponse, error) {
	return answer(ctx, is.s, is.s.metrics.intermediates, "intermediate request refused", req, is.s.signIntermediate)
}

func (s *Service) signIntermediate(ctx context.Context, r authn.Request, req *identityapi.SignIntermediateRequest) (*identityapi.SignIntermediateResponse, authn.Identity, *refusal) {
	if s.cfg.Intermediates == nil {
		return nil, authn.Identity{}, &refusal{codes.FailedPrecondition, "not_configured", "this server does not sign intermediates", nil}
	}
	if proto.Size(req) > maxIntermediateRequestSize {
		return nil, authn.Identity{}, &refusal{codes.ResourceExhausted, "too_large", fmt.Sprintf("request larger than %d bytes", maxIntermediateRequestSize), nil}
	}
	ident, ref := s.authenticate(ctx, r, s.identityAuth)
	if ref != nil {
		return nil, ident, ref
	}
	if ref := s.downstreamAllowed(ident); ref != nil {
		return nil, ident, ref
	}
	// The CSR's signature is checked in the slot, as for certificates.
	release, ref := s.admission.admit(ctx, ident.ID, proto.Size(req))
	if ref != nil {
		return nil, ident, ref
	}
	defer release()
	csr, ttl, ref := s.parseIntermediateRequest(req)
	if ref != nil {
		return nil, ident, ref
	}
	chain, err := s.cfg.Intermediates.SignIntermediate(csr, ttl)
	if err == nil && (chain == nil || len(chain.Chain) == 0 || len(chain.Roots) == 0) {
		err = errors.New("signer returned no intermediate or no roots")
	}
	if err != nil {
		return nil, ident, signRefusal(err)
	}
	leaf := chain.Chain[0]
	s.cfg.Logger.Info("intermediate issued", logattr.SPIFFEID, ident.ID.String(), "method", ident.Method,
		"serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339), logattr.Address, r.Peer)
	return intermediateResponse(chain), ident, nil
}

// downstreamAllowed refuses a caller that did not prove an X509-SVID, or
// whose SPIFFE ID is not in Config.DownstreamAllow.
func (s *Service) downstreamAllowed(ident authn.Identity) *refusal {
	if len(s.cfg.DownstreamAllow) == 0 {
		return &refusal{codes.PermissionDenied, "downstream_not_allowed",
			"this server signs no intermediates: no downstream is allowed; add the downstream's SPIFFE ID with --downstream-allow", nil}
	}
	if ident.Method != authn.MethodX509SVID {
		return &refusal{codes.PermissionDenied, "downstream_not_x509",
			fmt.Sprintf("an intermediate is signed only for a caller authenticated by an X509-SVID (mTLS), not by %s; present the downstream's SVID as the client certificate", ident.Method), nil}
	}
	if !slices.Contains(s.cfg.DownstreamAllow, ident.ID) {
		return &refusal{codes.PermissionDenied, "downstream_not_allowed",
			fmt.Sprintf("%s is not in this server's --downstream-allow; add it there", ident.ID), nil}
	}
	return nil
}

// parseIntermediateRequest returns the request's CSR, its signature
// checked, and the lifetime to sign: the one asked for clamped to the
// maximum, the maximum when none is asked for.
func (s *Service) parseIntermediateRequest(req *identityapi.SignIntermediateRequest) (*x509.CertificateRequest, time.Duration, *refusal) {
	csr, err := ca.ParseCSR(req.GetCsr())
	if err != nil {
		return nil, 0, &refusal{codes.InvalidArgument, "invalid_csr", fmt.Sprintf("csr is not a valid PKCS#10 request (DER): %v", err), nil}
	}
	ttl, ref := validity("ttl_seconds", req.GetTtlSeconds())
	if ref != nil {
		return nil, 0, ref
	}
	if ttl == 0 || ttl > s.cfg.MaxDownstreamTTL {
		ttl = s.cfg.MaxDownstreamTTL
	}
	return csr, ttl, nil
}

func intermediateResponse(chain *ca.UpstreamChain) *identityapi.SignIntermediateResponse {
	resp := &identityapi.SignIntermediateResponse{}
	for _, c := range chain.Chain {
		resp.CertChain = append(resp.CertChain, c.Raw)
	}
	for _, c := range chain.Roots {
		resp.Roots = append(resp.Roots, c.Raw)
	}
	return resp
}

// checkDownstreamAllow refuses an allow-list entry outside td (when td is
// set): an intermediate is only ever signed for this trust domain's
// servers.
func checkDownstreamAllow(allow []spiffeid.ID, td spiffeid.TrustDomain) error {
	for _, id := range allow {
		if id.IsZero() {
			return errors.New("certservice: empty SPIFFE ID in the downstream allow-list")
		}
		if !td.IsZero() && id.TrustDomain() != td {
			return fmt.Errorf("certservice: downstream %s is not in trust domain %s; --downstream-allow takes SPIFFE IDs of this trust domain", id, td)
		}
	}
	return nil
}
