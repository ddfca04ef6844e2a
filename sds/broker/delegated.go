package broker

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	delegatedv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/agent/delegatedidentity/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/protobuf/proto"

	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// delegatedAPI is SPIRE's Delegated Identity API
// (spire.api.agent.delegatedidentity.v1.DelegatedIdentity), for brokers
// written against SPIRE's agent.
type delegatedAPI struct {
	delegatedv1.UnimplementedDelegatedIdentityServer
	s *Server
}

func (a *delegatedAPI) SubscribeToX509SVIDs(req *delegatedv1.SubscribeToX509SVIDsRequest, ss delegatedv1.DelegatedIdentity_SubscribeToX509SVIDsServer) error {
	ctx := ss.Context()
	c, err := a.s.begin(ctx, apiDelegated, "SubscribeToX509SVIDs")
	if err != nil {
		a.s.end(ctx, c, nil, err)
		return err
	}
	r, err := ParseDelegated(req.GetPid(), req.GetSelectors())
	if err != nil {
		err = a.s.status(ctx, c, err)
		a.s.end(ctx, c, nil, err)
		return err
	}
	c.ref = r.String()
	return a.s.stream(ctx, c, &r, delegatedX509SVIDs,
		func(m proto.Message) error { return ss.Send(m.(*delegatedv1.SubscribeToX509SVIDsResponse)) })
}

// delegatedX509SVIDs is the workload's SVID as SPIRE's agent sends it,
// with the trust domains the workload may trust beside its own as
// federates_with (sorted): a broker uses only those of the bundles it
// gets to verify this workload's peers.
func delegatedX509SVIDs(w *Workload, st *wapi.State) (proto.Message, error) {
	if err := hasSVID(w, st); err != nil {
		return nil, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(st.SVID.Key)
	if err != nil {
		return nil, fmt.Errorf("broker: the private key of %s: %w", st.SVID.ID, err)
	}
	chain := make([][]byte, len(st.SVID.Chain))
	for i, c := range st.SVID.Chain {
		chain[i] = c.Raw
	}
	resp := &delegatedv1.SubscribeToX509SVIDsResponse{
		X509Svids: []*delegatedv1.X509SVIDWithKey{{
			X509Svid: &spiretypes.X509SVID{
				Id:        &spiretypes.SPIFFEID{TrustDomain: w.ID.TrustDomain().Name(), Path: w.ID.Path()},
				CertChain: chain,
				ExpiresAt: st.SVID.Chain[0].NotAfter.Unix(),
			},
			X509SvidKey: key,
		}},
	}
	for _, b := range st.Bundles {
		if b.TrustDomain() != w.ID.TrustDomain() {
			resp.FederatesWith = append(resp.FederatesWith, b.TrustDomain().IDString())
		}
	}
	slices.Sort(resp.FederatesWith)
	return resp, nil
}

// The bundle streams name no workload: they carry the trust of the
// broker's own identity (ResolveCaller), which the trust policy grants
// as it grants any workload's.

func (a *delegatedAPI) SubscribeToX509Bundles(_ *delegatedv1.SubscribeToX509BundlesRequest, ss delegatedv1.DelegatedIdentity_SubscribeToX509BundlesServer) error {
	return a.subscribeSelf(ss.Context(), "SubscribeToX509Bundles",
		func(_ *Workload, st *wapi.State) (proto.Message, error) {
			return &delegatedv1.SubscribeToX509BundlesResponse{CaCertificates: x509Bundles(st, noTrustDomain)}, nil
		},
		func(m proto.Message) error { return ss.Send(m.(*delegatedv1.SubscribeToX509BundlesResponse)) })
}

func (a *delegatedAPI) SubscribeToJWTBundles(_ *delegatedv1.SubscribeToJWTBundlesRequest, ss delegatedv1.DelegatedIdentity_SubscribeToJWTBundlesServer) error {
	return a.subscribeSelf(ss.Context(), "SubscribeToJWTBundles",
		func(_ *Workload, st *wapi.State) (proto.Message, error) {
			b, err := jwtBundles(st)
			if err != nil {
				return nil, err
			}
			return &delegatedv1.SubscribeToJWTBundlesResponse{Bundles: b}, nil
		},
		func(m proto.Message) error { return ss.Send(m.(*delegatedv1.SubscribeToJWTBundlesResponse)) })
}

func (a *delegatedAPI) subscribeSelf(ctx context.Context, method string, build builder, send func(proto.Message) error) error {
	c, err := a.s.begin(ctx, apiDelegated, method)
	if err != nil {
		a.s.end(ctx, c, nil, err)
		return err
	}
	c.ref = "the broker's own identity"
	return a.s.stream(ctx, c, nil, build, send)
}

func (a *delegatedAPI) FetchJWTSVIDs(ctx context.Context, req *delegatedv1.FetchJWTSVIDsRequest) (resp *delegatedv1.FetchJWTSVIDsResponse, err error) {
	c, err := a.s.begin(ctx, apiDelegated, "FetchJWTSVIDs")
	var w *Workload
	defer func() { a.s.end(ctx, c, w, err) }()
	if err != nil {
		return nil, err
	}
	if err := wapi.CheckAudience(req.GetAudience()); err != nil {
		return nil, err
	}
	r, err := ParseDelegated(req.GetPid(), req.GetSelectors())
	if err != nil {
		return nil, a.s.status(ctx, c, err)
	}
	c.ref = r.String()
	var token string
	if w, token, err = a.s.mint(ctx, c, r, req.GetAudience(), ""); err != nil {
		return nil, err
	}
	svid := &spiretypes.JWTSVID{
		Token: token,
		Id:    &spiretypes.SPIFFEID{TrustDomain: w.ID.TrustDomain().Name(), Path: w.ID.Path()},
	}
	// Our own token: its times are read, not verified.
	if t, perr := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.RS256}); perr == nil {
		var claims jwt.Claims
		if t.UnsafeClaimsWithoutVerification(&claims) == nil {
			svid.ExpiresAt, svid.IssuedAt = claims.Expiry.Time().Unix(), claims.IssuedAt.Time().Unix()
		}
	}
	return &delegatedv1.FetchJWTSVIDsResponse{Svids: []*spiretypes.JWTSVID{svid}}, nil
}
